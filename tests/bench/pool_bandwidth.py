"""Read-only, write-only and in-place bandwidth of the bench pools (the spec4 and bf16-state
cases), timed as the peer bench times its in-place calibration: mean of 100 CUDA-graph replays.

Usage: python3 tests/bench/pool_bandwidth.py  (needs PyTorch and a GPU)
"""
import torch

def graph_ms(fn, iters=100):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay(); torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        g.replay()
    b.record(); torch.cuda.synchronize()
    return a.elapsed_time(b) / iters

def main():
    for name, n, dt in [("spec4 pool (1024 f32 states)", 1024, torch.float32), ("bf16 pool (256 bf16 states)", 256, torch.bfloat16)]:
        x = torch.randn(n, 32, 128, 128, dtype=dt, device="cuda") * 0.1
        by = x.numel() * x.element_size()
        out = torch.empty((), dtype=torch.float32, device="cuda")
        t_inplace = graph_ms(lambda: x.mul_(0.999))
        t_write = graph_ms(lambda: x.fill_(0.5))
        t_read = graph_ms(lambda: torch.sum(x, dim=(0, 1, 2, 3), dtype=torch.float32, out=out))
        print(f"{name}: in-place {2*by/t_inplace/1e6:.0f} GB/s, write-only {by/t_write/1e6:.0f} GB/s, read-only {by/t_read/1e6:.0f} GB/s")


if __name__ == "__main__":
    main()
