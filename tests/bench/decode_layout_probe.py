"""Triton probes of how a decode kernel's blocks should be laid out, on spec4's shapes (B = 256,
T = 4, HV = 32, f32 pool of 2048 states, random slots), timed as the peer bench times: mean of
100 CUDA-graph replays, graded against the in-place pass of the same 1024 states.

- `pattern`: the memory traffic alone (read one state per sequence, write one per token), one
  (sequence, head, row block) per program or persistent programs taking many sequences, each
  in two grid orders (0: row blocks fastest, then heads, then sequences; 1: sequences first).
- `step`: the whole step (k, q, v, gate, beta loads, norms, decay, both reductions, update,
  output), one (sequence, head, row block) per program, both grid orders.
- `b1`: the whole step at B = 1, T = 1 (launch-latency bound).

Not a reference implementation (gate without A_log and dt_bias, no scale): a yardstick for the
layout. Usage: python3 tests/bench/decode_layout_probe.py [pattern|step|b1 ...]  (needs
PyTorch, Triton and a GPU)
"""
import statistics, sys
import torch, triton, triton.language as tl
from pool_bandwidth import graph_ms  # same folder: CUDA-graph replays, timed as the peer bench times


@triton.jit
def pattern_one(pool, idx, nacc, ROWS: tl.constexpr, T: tl.constexpr, HV: tl.constexpr, NVB: tl.constexpr,
                NSEQ: tl.constexpr, ORDER: tl.constexpr):
    pid = tl.program_id(0)
    if ORDER == 0:
        vb = pid % NVB; hv = (pid // NVB) % HV; n = pid // (NVB * HV)
    else:
        n = pid % NSEQ; vb = (pid // NSEQ) % NVB; hv = pid // (NSEQ * NVB)
    offs = tl.arange(0, ROWS)[:, None] * 128 + tl.arange(0, 128)[None, :]
    inslot = hv * 16384 + vb * ROWS * 128
    rs = tl.load(idx + n * T + tl.load(nacc + n) - 1)
    s = tl.load(pool + rs.to(tl.int64) * (HV * 16384) + inslot + offs)
    for t in tl.static_range(T):
        ws = tl.load(idx + n * T + t)
        s = s * 0.999
        tl.store(pool + ws.to(tl.int64) * (HV * 16384) + inslot + offs, s)


@triton.jit
def pattern_persistent(pool, idx, nacc, ITEMS: tl.constexpr, ROWS: tl.constexpr, T: tl.constexpr,
                       HV: tl.constexpr, ORDER: tl.constexpr):
    if ORDER == 0:
        col = tl.program_id(0); hv = tl.program_id(1); vb = tl.program_id(2)
    else:
        vb = tl.program_id(0); hv = tl.program_id(1); col = tl.program_id(2)
    offs = tl.arange(0, ROWS)[:, None] * 128 + tl.arange(0, 128)[None, :]
    inslot = hv * 16384 + vb * ROWS * 128
    n = col * ITEMS
    rs = tl.load(idx + n * T + tl.load(nacc + n) - 1)
    s = tl.load(pool + rs.to(tl.int64) * (HV * 16384) + inslot + offs)
    for it in range(ITEMS):
        n = col * ITEMS + it
        nn = tl.minimum(n + 1, col * ITEMS + ITEMS - 1)
        rn = tl.load(idx + nn * T + tl.load(nacc + nn) - 1)
        s_next = tl.load(pool + rn.to(tl.int64) * (HV * 16384) + inslot + offs)
        for t in tl.static_range(T):
            ws = tl.load(idx + n * T + t)
            s = s * 0.999
            tl.store(pool + ws.to(tl.int64) * (HV * 16384) + inslot + offs, s)
        s = s_next


@triton.jit
def step(pool, idx, nacc, q, k, v, a, b, out, ROWS: tl.constexpr, T: tl.constexpr, HV: tl.constexpr,
         ORDER: tl.constexpr):
    if ORDER == 0:
        vb = tl.program_id(0); hv = tl.program_id(1); n = tl.program_id(2)
    else:
        n = tl.program_id(0); hv = tl.program_id(1); vb = tl.program_id(2)
    rows = vb * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, 128)
    inslot = hv * 16384 + rows[:, None] * 128 + cols[None, :]
    rs = tl.load(idx + n * T + tl.load(nacc + n) - 1)
    s = tl.load(pool + rs.to(tl.int64) * (HV * 16384) + inslot)
    for t in tl.static_range(T):
        tok = n * T + t
        kk = tl.load(k + (tok * HV + hv) * 128 + cols).to(tl.float32)
        qq = tl.load(q + (tok * HV + hv) * 128 + cols).to(tl.float32)
        aa = tl.load(a + (tok * HV + hv) * 128 + cols).to(tl.float32)
        vv = tl.load(v + (tok * HV + hv) * 128 + rows).to(tl.float32)
        bb = tl.load(b + tok * HV + hv).to(tl.float32)
        ws = tl.load(idx + n * T + t)
        kk = kk * tl.math.rsqrt(tl.sum(kk * kk) + 1e-6)
        qq = qq * tl.math.rsqrt(tl.sum(qq * qq) + 1e-6)
        s = s * tl.exp(-5.0 * tl.sigmoid(aa))[None, :]
        sk = tl.sum(s * kk[None, :], 1)
        sq = tl.sum(s * qq[None, :], 1)
        u = tl.sigmoid(bb) * (vv - sk)
        o = sq + u * tl.sum(kk * qq)
        s = s + u[:, None] * kk[None, :]
        tl.store(out + (tok * HV + hv) * 128 + rows, o.to(tl.bfloat16))
        tl.store(pool + ws.to(tl.int64) * (HV * 16384) + inslot, s)


def inputs(B, T, HV=32):
    torch.manual_seed(0)
    pool = torch.randn(2 * B * T, HV, 128, 128, device="cuda") * 0.1
    idx = torch.randperm(2 * B * T, device="cuda").to(torch.int32)[: B * T].view(B, T).contiguous()
    nacc = torch.randint(1, T + 1, (B,), dtype=torch.int32, device="cuda")
    q = torch.randn(B, T, HV, 128, dtype=torch.bfloat16, device="cuda")
    k, v, a = torch.randn_like(q), torch.randn_like(q), torch.randn_like(q)
    b = torch.randn(B, T, HV, dtype=torch.bfloat16, device="cuda")
    return pool, idx, nacc, q, k, v, a, b, torch.empty_like(v)


def main():
    B, T, HV = 256, 4, 32
    pool, idx, nacc, q, k, v, a, b, out = inputs(B, T)
    sub = pool[: B * T]
    cal_bw = 2 * sub.numel() * 4 / graph_ms(lambda: sub.mul_(0.999)) / 1e6
    nbytes = (B + B * T) * HV * 128 * 128 * 4
    print(f"in-place {cal_bw:.0f} GB/s; spec4 at 85% means {nbytes / (0.85 * cal_bw) / 1e6:.4f} ms")

    def rep(name, fn):
        ms = min(graph_ms(fn) for _ in range(3))
        print(f"{name:44s} {ms:.4f} ms  {100 * nbytes / (ms * 1e6) / cal_bw:.1f}% of in-place", flush=True)

    what = sys.argv[1:] or ["pattern", "step", "b1"]
    for rows, warps in ((16, 1), (32, 1), (32, 2), (64, 2), (128, 4)):
        nvb = 128 // rows
        for order in (0, 1):
            if "pattern" in what:
                rep(f"pattern, one per program {rows}x{warps} order {order}", lambda: pattern_one[(B * HV * nvb,)](
                    pool, idx, nacc, ROWS=rows, T=T, HV=HV, NVB=nvb, NSEQ=B, ORDER=order, num_warps=warps))
                grid = (4, HV, nvb) if order == 0 else (nvb, HV, 4)
                rep(f"pattern, persistent {rows}x{warps} order {order}", lambda: pattern_persistent[grid](
                    pool, idx, nacc, ITEMS=B // 4, ROWS=rows, T=T, HV=HV, ORDER=order, num_warps=warps))
            if "step" in what:
                grid = (nvb, HV, B) if order == 0 else (B, HV, nvb)
                rep(f"step, one per program {rows}x{warps} order {order}", lambda: step[grid](
                    pool, idx, nacc, q, k, v, a, b, out, ROWS=rows, T=T, HV=HV, ORDER=order, num_warps=warps))
    if "b1" in what:
        pool, idx, nacc, q, k, v, a, b, out = inputs(1, 1)
        for rows, warps in ((4, 1), (8, 1), (16, 1), (32, 1), (32, 4)):
            nvb = 128 // rows
            fn = lambda: step[(nvb, HV, 1)](pool, idx, nacc, q, k, v, a, b, out, ROWS=rows, T=1, HV=HV, ORDER=0,
                                            num_warps=warps)
            ms = [graph_ms(fn) for _ in range(5)]
            print(f"B = 1 step {rows}x{warps}: median {statistics.median(ms) * 1000:.2f} us", flush=True)


if __name__ == "__main__":
    main()
