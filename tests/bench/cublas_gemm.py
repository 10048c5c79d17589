"""cuBLAS (torch.matmul) bf16 GEMM beside `kda bench`: median of CUDA-event timings.

Usage (on the GPU machine): python3 tests/bench/cublas_gemm.py [--json FILE]
"""
import json
import sys

import torch

rows = []
for m, n, k, bt in [(8192, 8192, 8192, True), (8192, 8192, 8192, False), (4096, 4096, 4096, True)]:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) if bt else torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    f = (lambda: torch.matmul(a, b.t())) if bt else (lambda: torch.matmul(a, b))
    for _ in range(5):
        f()
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        f()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    ms = sorted(times)[len(times) // 2]
    tflops = 2 * m * n * k / (ms * 1e-3) / 1e12
    case = f"gemm_bf16_{'abt' if bt else 'ab'}_m{m}_n{n}_k{k}"
    print(f"{case:<36} {ms:>10.4f} {tflops:>10.1f}   cublas")
    rows.append({"case": case, "impl": "cublas", "ms": ms, "tflops": tflops})
if len(sys.argv) == 3 and sys.argv[1] == "--json":
    with open(sys.argv[2], "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
