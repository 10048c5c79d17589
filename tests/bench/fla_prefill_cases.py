"""FLA's prefill on some of the standard cases only: `fla_ref.py`'s rows and timing (this
folder's), for a side-by-side call that must not spend FLA's first-call compile (about 100 s a
shape family) on rows it does not compare.

Usage (on the GPU machine, with torch, triton and fla-core 0.6.0):
python3 tests/bench/fla_prefill_cases.py CASE[,CASE..] OUT.jsonl
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fla_ref  # noqa: E402  tests/bench/fla_ref.py

names = sys.argv[1].split(",")
unknown = [n for n in names if n not in {row[0] for row in fla_ref.PREFILL}]
if unknown:
    sys.exit(f"unknown prefill cases: {', '.join(unknown)}")
fla_ref.write_rows((fla_ref.prefill(*row) for row in fla_ref.PREFILL if row[0] in names), sys.argv[2])
