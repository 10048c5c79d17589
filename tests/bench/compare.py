"""Joins two bench outputs (JSON lines with at least "case" and "ms") into one table, case by case.

Usage: python3 tests/bench/compare.py OURS.jsonl PEER.jsonl[:IMPL]
  e.g. compare.py kda.jsonl fla.jsonl
       compare.py kda.jsonl cudnn.jsonl:cudnn_kda_hopper_cuda

A file that holds several implementations' rows takes `:IMPL` to keep only rows whose "impl" is
IMPL (either file may take one). Rows without "ms" (a peer's error rows) are left out and listed
after the table.

Columns, per case:
  ms              each side's time, and speedup = peer ms / ours ms (above 1: ours is faster);
  % in-place bw   decode: each side's bandwidth (its "gbps") over the in-place read+write pass
                  the PEER's run measured on the same GPU ("inplace_gbps", or what its
                  "gbps" and "pct_of_inplace_bw" imply), so neither side grades itself;
  % floor         prefill: the time the case's byte floor ("min_bytes", the peer's if it has
                  one, else ours) takes at 4.25 TB/s (the H200's measured copy bandwidth) over
                  each side's time;
  first s         each side's first call, wall seconds (compile included).
"""
import json
import os
import sys

COPY_BYTES_PER_S = 4.25e12


def split_spec(spec):
    """`path[:impl]` -> (path, impl or None). A path that exists as given wins over the split."""
    if os.path.exists(spec) or ":" not in spec:
        return spec, None
    path, impl = spec.rsplit(":", 1)
    return path, impl or None


def load(spec):
    """(rows by case, impls seen, error rows) of one JSON-lines file; the last row of a case wins."""
    path, impl = split_spec(spec)
    rows, impls, errors = {}, set(), []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if impl is not None and r.get("impl") != impl:
                continue
            if "ms" not in r:
                errors.append(r)
                continue
            rows[r["case"]] = r
            impls.add(r.get("impl"))
    if impl is None and len(impls) > 1:
        print(
            f"note: {path} holds rows of several impls ({', '.join(sorted(map(str, impls)))}); the last row "
            f"of each case is used; pick one with {path}:IMPL",
            file=sys.stderr,
        )
    return rows, impls, errors


def inplace_gbps(row):
    """The in-place pass bandwidth a decode row was graded against, or None."""
    if not row:
        return None
    if row.get("inplace_gbps"):
        return row["inplace_gbps"]
    if row.get("pct_of_inplace_bw") and row.get("gbps"):
        return row["gbps"] * 100 / row["pct_of_inplace_bw"]
    return None


def pct(x):
    return f"{x:.0f}%"


def compare_row(case, a, b):
    """The table's cells for one case: a is ours, b the peer's (either may be None)."""
    cells = {
        "ours_ms": f"{a['ms']:.4f}" if a else "-",
        "peer_ms": f"{b['ms']:.4f}" if b else "-",
        "speedup": f"{b['ms'] / a['ms']:.2f}x" if a and b and a["ms"] > 0 else "-",
        "ours_bw": "", "peer_bw": "", "ours_floor": "", "peer_floor": "", "ours_first": "", "peer_first": "",
    }
    cal = inplace_gbps(b)
    if cal:
        if b.get("gbps"):
            cells["peer_bw"] = pct(100 * b["gbps"] / cal)
        if a and a.get("gbps"):
            cells["ours_bw"] = pct(100 * a["gbps"] / cal)
    elif case.startswith("prefill"):
        nbytes = (b or {}).get("min_bytes") or (a or {}).get("min_bytes")
        if nbytes:
            floor_ms = nbytes / COPY_BYTES_PER_S * 1e3
            if a and a["ms"] > 0:
                cells["ours_floor"] = pct(100 * floor_ms / a["ms"])
            if b and b["ms"] > 0:
                cells["peer_floor"] = pct(100 * floor_ms / b["ms"])
    if a and a.get("first_call_s") is not None:
        cells["ours_first"] = f"{a['first_call_s']:.2f}"
    if b and b.get("first_call_s") is not None:
        cells["peer_first"] = f"{b['first_call_s']:.2f}"
    return cells


COLUMNS = [  # (key, header, width)
    ("ours_ms", "ours ms", 10), ("peer_ms", "peer ms", 10), ("speedup", "speedup", 8),
    ("ours_bw", "ours %bw", 9), ("peer_bw", "peer %bw", 9),
    ("ours_floor", "ours %floor", 11), ("peer_floor", "peer %floor", 11),
    ("ours_first", "ours first s", 12), ("peer_first", "peer first s", 12),
]


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: compare.py OURS.jsonl PEER.jsonl[:IMPL]")
    ours, ours_impls, _ = load(argv[0])
    peer, peer_impls, peer_errors = load(argv[1])
    names = lambda impls: ", ".join(sorted(map(str, impls))) or "no rows"
    print(f"ours: {argv[0]} ({names(ours_impls)}); peer: {argv[1]} ({names(peer_impls)})")
    width = max([34] + [len(c) for c in list(ours) + list(peer)])
    print(f"{'case':{width}s} " + " ".join(f"{h:>{w}s}" for _, h, w in COLUMNS))
    for case in list(ours) + [c for c in peer if c not in ours]:
        cells = compare_row(case, ours.get(case), peer.get(case))
        print(f"{case:{width}s} " + " ".join(f"{cells[k]:>{w}s}" for k, _, w in COLUMNS))
    for r in peer_errors:
        print(f"peer row without a time: {r.get('case')} {r.get('impl')}: {r.get('error', '(no ms)')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
