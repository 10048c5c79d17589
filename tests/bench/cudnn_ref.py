"""The Hopper peer: NVIDIA cuDNN-frontend's sm90 KDA forward engines on kda's prefill cases.

nvidia-cudnn-frontend 1.32.0 offers two sm90 KDA forward engines, chosen here by plan name:
  kda_hopper_cuda  one fused CUDA kernel, compiled with NVRTC at first use (the default here);
  kda_hopper       a CuTe-DSL pair of kernels; needs nvidia-cutlass-dsl (ask for it with
                   --engines kda_hopper_cuda,kda_hopper).
The cases, inputs and gate are `fla_ref.py`'s (`fla_ref.PREFILL`, `fla_ref.prefill_inputs`):
bf16 q/k/v, gate logits g and beta logits; A_log and dt_bias with the safe gate's lower bound -5;
l2norm of q and k and the beta sigmoid in the kernel; an f32 V-first initial state in and the
final state out. cuDNN takes them in its THD layout ([tokens, heads, 128], a dense batch as
cu_seqlens [0, T, 2T, ..]).

Each engine gives two rows per case:
  impl "cudnn_<engine>"       g and beta handed over in bf16, as kda and FLA take them (the
                              frontend converts what its kernel does not read natively);
  impl "cudnn_<engine>_f32g"  g and beta converted to f32 beforehand, outside the timing (the
                              kernel alone). Should the frontend refuse f32 beta logits under
                              the in-kernel sigmoid, beta stays bf16 and the row says so.
Fields: case, impl, ms (do_bench median), first_call_s (graph build and NVRTC compile
included), mtok_per_s, min_bytes (the case's byte floor, as fla_ref.py counts it), g_dtype,
beta_dtype, method, and with FLA importable `rel_err_vs_fla`: [output, final state], each
|x - fla| / |fla| (Frobenius norms) against FLA's `chunk_kda` on the same inputs. A form the
frontend declines gives a row with "error" and no "ms" (compare.py lists it after its table).

Usage (GPU machine with torch, triton, nvidia-cudnn-frontend 1.32.0, and fla-core 0.6.0 for
the error check):
  python3 tests/bench/cudnn_ref.py [--case SUBSTRING] [--engines kda_hopper_cuda[,kda_hopper]]
                                   [--no-fla-check] [--out cudnn.jsonl]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fla_ref  # noqa: E402  the case table, the inputs, the byte floor and FLA's call


def rel_err(x, ref):
    """|x - ref| / |ref| in f32, x reshaped to ref's shape."""
    import torch

    x = x.reshape(ref.shape).float()
    ref = ref.float()
    return (torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30)).item()


def fla_reference(x):
    """FLA's (output, final states) on these inputs, or None without FLA."""
    import torch

    try:
        import fla.ops.kda  # noqa: F401
    except ImportError:
        return None
    with torch.inference_mode():
        out, final = fla_ref.fla_chunk(x)
    torch.cuda.synchronize()
    return out, final


def thd_operands(x, B, T, HV, lens):
    """`prefill_inputs`' tensors in cuDNN's THD layout: (q, k, v, g, beta, cu_seqlens int32,
    a_log [HV], dt_bias [HV, D])."""
    import torch

    lengths = [T] * B if lens is None else list(lens)
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    cu = torch.tensor(offsets, dtype=torch.int32, device="cuda")

    def flat(t):  # [B, T, ...] -> [B·T, ...], a view of the same memory
        return t.reshape(B * T, *t.shape[2:])

    return (flat(x["q"]), flat(x["k"]), flat(x["v"]), flat(x["g"]), flat(x["beta"]), cu,
            x["A_log"], x["dt_bias"].view(HV, fla_ref.D))


def run_form(row, engine, f32g, x, ref):
    """One JSON row: `engine` on one case in one form (bf16 or f32 g and beta)."""
    import torch
    from triton.testing import do_bench
    import cudnn.linear_attention as la

    name, B, T, H, HV, lens, _gates = row  # the gates are in `x` already
    q, k, v, g, beta, cu, a_log, dt_bias = thd_operands(x, B, T, HV, lens)
    if f32g:
        g, beta = g.float(), beta.float()

    def call(beta_in):
        return la.kimi_delta_attention(
            q, k, v, g, beta_in, cu,
            initial_state=x["h0"],
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            use_beta_sigmoid_in_kernel=True,
            safe_gate=True,
            gate_lower_bound=fla_ref.LOWER_BOUND,
            a_log=a_log,
            dt_bias=dt_bias,
            plan_name=engine,
        )

    result = {"case": name, "impl": f"cudnn_{engine}" + ("_f32g" if f32g else "")}
    with torch.inference_mode():
        torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            out, final = call(beta)
        except TypeError as e:
            # A frontend that wants the beta logits in the io dtype under the in-kernel sigmoid:
            # keep g in f32, hand beta over in bf16, and say so in the row.
            if not (f32g and "beta" in str(e)):
                raise
            beta = beta.to(q.dtype)
            result["note"] = f"f32 beta refused ({e}); beta given in {q.dtype}"[:300]
            start = time.perf_counter()
            out, final = call(beta)
        torch.cuda.synchronize()
        result["first_call_s"] = time.perf_counter() - start
        result["ms"] = do_bench(lambda: call(beta), warmup=25, rep=200, return_mode="median")
        if ref is not None:
            result["rel_err_vs_fla"] = [rel_err(out, ref[0]), rel_err(final, ref[1])]
    result["mtok_per_s"] = B * T / result["ms"] / 1e3
    result["min_bytes"] = fla_ref.prefill_min_bytes(B, T, H, HV, x["n"])
    result["g_dtype"] = str(g.dtype).replace("torch.", "")
    result["beta_dtype"] = str(beta.dtype).replace("torch.", "")
    result["method"] = "do_bench median"
    return result


def results(rows, engines, fla_check):
    """Each engine's row, with and without an f32 gate, on each case in `rows`."""
    for row in rows:
        x = fla_ref.prefill_inputs(*row[1:])
        ref = fla_reference(x) if fla_check else None
        for engine in engines:
            for f32g in (False, True):
                try:
                    yield run_form(row, engine, f32g, x, ref)
                except Exception as e:  # a missing or declining engine: record it, go on
                    yield {"case": row[0], "impl": f"cudnn_{engine}" + ("_f32g" if f32g else ""),
                           "error": f"{type(e).__name__}: {e}"[:400]}
        del x, ref


def main(argv=None):
    ap = argparse.ArgumentParser(description="cuDNN-frontend's sm90 KDA engines on kda's prefill cases, as JSON lines")
    ap.add_argument("--case", default="", help="only the prefill cases whose name contains this, or one of these comma-separated names")
    ap.add_argument("--engines", default="kda_hopper_cuda", help="comma-separated plan names (kda_hopper_cuda, kda_hopper)")
    ap.add_argument("--no-fla-check", action="store_true", help="skip rel_err_vs_fla (FLA's first call compiles for minutes)")
    ap.add_argument("--out", default=None, help="also write the JSON lines to this file")
    args = ap.parse_args(argv)
    rows = [row for row in fla_ref.PREFILL if fla_ref.named(row[0], args.case)]
    if not rows:
        sys.exit(f"no prefill case name contains {args.case!r}; the cases: {', '.join(r[0] for r in fla_ref.PREFILL)}")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    try:
        import cudnn.linear_attention  # noqa: F401
    except ImportError as e:
        sys.exit(f"cuDNN-frontend's linear attention is not importable ({e}); see tests/bench/README.md")
    fla_ref.write_rows(results(rows, engines, not args.no_fla_check), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
