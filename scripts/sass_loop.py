#!/usr/bin/env python3
"""Static estimate of one iteration of a kernel's busiest loop, read from its SASS.

    scripts/sass_loop.py FAMILY [CONFIG] [--target sm_80|sm_90a] [--shape SHAPE] [--warps N] [--at 0xTOP] [--lines N]
    scripts/sass_loop.py --all

`--all` prints one line per shipped variant (`kda list`): its registers, spill bytes and the
instructions of its busiest loop, to compare two commits' code at a glance.

`--shape` passes to `kda emit chunk`: a `kda bench --sweep-chunk` shape (`4x2w32ik`, say) instead of
the config's own. Builds nothing: it runs `target/release/kda emit`, ptxas and nvdisasm (from KDA_PTXAS and
KDA_NVDISASM, else `.cache/`), lists the loops (a label and the branch back to it), takes
the one with the most instructions (or the one starting at `--at`) and prints, per iteration
of one warp:

- the instructions by class, and the source lines with the most instructions (by class);
- the issue bound: a warp scheduler issues one instruction a cycle, and the block's warps
  share the SM's four schedulers, so an iteration takes at least `instructions x warps / 4`
  cycles, and at least `instructions` (the warps from the PTX's `.maxntid`, fill and producer warps included: `--warps`
  gives those that run the loop);
- the latency bound: the cycles one warp takes to issue the iteration in order, each
  instruction waiting for its operands (register dependences) and each barrier for every
  earlier result, with the latencies of LATENCY below; and the kernel source lines taking the
  most of those cycles (their instructions' issue and waits);
- the tensor bound: the cycles the SM's tensor cores spend on the iteration's `HGMMA`s for all
  warpgroups (dense bf16 or f16: 2048 multiply-adds a cycle per SM);
- the shared bound: the cycles shared memory takes to serve the iteration's accesses for all
  the block's warps at one 128-byte wavefront a cycle per SM, each lane reading its own bytes
  and no bank conflict: `LDS`/`STS` of 4, 8 or 16 bytes a lane take 1, 2 or 4 wavefronts a
  warp, an `LDSM`/`STSM` one a matrix, `LDGSTS` its write, an `HGMMA` its shared operands once
  per warpgroup. Conflicts add to it (`kda conflicts` counts them in the PTX's terms); lanes
  reading one address (a broadcast) take one wavefront, less than it counts.

These are estimates, not measurements: the latencies are assumptions (public microbenchmarks
of Ampere and Hopper put them in these ranges; none is measured here), branches inside the
loop are taken as straight-line code (every instruction counted), and warps are assumed to
overlap perfectly on a scheduler. An iteration takes at least the largest bound; where the
latency bound leads, more independent work per warp (or more warps) would fill the gaps.
"""

import collections
import os
import re
import subprocess
import sys
import tempfile

# Cycles from an instruction's issue until its result can be read (assumed: see above).
LATENCY = {
    "alu": 4,  # FFMA, FADD, FMUL, IMAD, IADD3, LOP3, SHF, LEA, FSEL, MOV, PRMT, F2FP, ...
    "mufu": 16,  # MUFU.EX2, RCP, RSQ, ...
    "shfl": 24,
    "lds": 30,  # LDS
    "ldsm": 32,  # LDSM
    "sts": 20,  # STS: until a barrier may release readers
    "global": 600,  # LDG (off the step's chain when the pipeline works)
    "bar": 24,  # BAR.SYNC, once every earlier result is in
    "fence": 40,  # MEMBAR, FENCE
    "hgmma_fixed": 24,  # HGMMA pipeline latency beside its tensor cycles
    "hmma": 32,  # HMMA.16816 (mma.sync m16n8k16)
}
TENSOR_FMA_PER_CYCLE = 2048  # dense bf16/f16 per SM per cycle (H100/H200)
WAVEFRONT_BYTES = 128  # shared memory serves 32 banks of 4 bytes a cycle per SM

CLASSES = [
    ("tensor", ("HGMMA", "HMMA")),
    ("shared", ("LDS", "STS", "LDSM", "STSM")),
    ("global", ("LDG", "STG", "LDGSTS", "UTMALDG", "UTMASTG", "LDGDEPBAR", "RED", "ATOM")),
    ("special", ("MUFU",)),
    ("shuffle", ("SHFL",)),
    ("sync", ("BAR", "MEMBAR", "FENCE", "DEPBAR", "WARPGROUP", "WARPSYNC", "SYNCS", "BSSY", "BSYNC")),
    ("float", ("FFMA", "FMUL", "FADD", "FSEL", "FSETP", "FMNMX", "F2FP", "F2F", "FCHK", "FRND")),
    ("branch", ("BRA", "EXIT", "RET", "CALL")),
]


def opcode(text):
    """The opcode of one SASS instruction, its guard predicate left out."""
    return re.sub(r"^@!?U?P\d\s+", "", text).split(" ")[0]


def op_class(op):
    base = op.split(".")[0]
    for name, ops in CLASSES:
        if base in ops:
            return name
    return "integer"


def tool(var, name):
    return os.environ.get(var) or os.path.join(".cache", name)


def sass_of(args):
    """The kernel's SASS as (address, instruction, (file, line)) rows, ptxas's log and the
    block's threads. ptxas keeps line tables (`-lineinfo`, which changes no instruction) and
    nvdisasm prints them; branch targets are given as addresses."""
    kda = os.path.join("target", "release", "kda")
    ptx = subprocess.run([kda, "emit", *args], check=True, capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as d:
        src, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        open(src, "w").write(ptx)
        arch = re.search(r"^\.target (\S+)", ptx, re.M).group(1)
        log = subprocess.run(
            [tool("KDA_PTXAS", "ptxas"), f"-arch={arch}", "-v", "-lineinfo", src, "-o", cubin],
            check=True, capture_output=True, text=True,
        ).stderr
        sass = subprocess.run(
            [tool("KDA_NVDISASM", "nvdisasm"), "-g", "-c", cubin], check=True, capture_output=True, text=True
        ).stdout
    threads = re.search(r"\.(?:reqntid|maxntid) (\d+)", ptx)
    return instructions(sass), log, int(threads.group(1)) if threads else None


def instructions(sass):
    """(address, text, (file, line)) of every instruction of nvdisasm's `-g` listing."""
    rows, labels, pending, where = [], {}, [], None
    for line in sass.splitlines():
        s = line.strip()
        m = re.search(r'//## File "(.*?)", line (\d+)', s)
        if m:
            where = (m.group(1).split("/")[-1], int(m.group(2)))
            continue
        m = re.match(r"\.(L_x_\d+):", s)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", s)
        if m:
            addr = int(m.group(1), 16)
            for label in pending:
                labels[label] = addr
            pending = []
            rows.append((addr, m.group(2), where))
    target = lambda m: hex(labels.get(m.group(1), 0))
    return [(a, re.sub(r"`\(\.(L_x_\d+)\)", target, t), w) for a, t, w in rows]


def loops(ins):
    """Every loop as (top address, bottom address, its instructions). A loop whose barriers
    are `barrier.sync` (a kernel with fill warps) holds two copies of its body: ptxas branches
    to one with `BAR.SYNC` inline when the warp is converged (`BRA.CONV ~URZ`) and falls through
    to one calling a barrier routine otherwise. Warps arrive converged, so an iteration runs the
    first; the fallback is left out."""
    fallback = set()
    for addr, text, _ in ins:
        m = re.match(r"BRA\.CONV ~URZ, (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) > addr:
            fallback.update(a for a, _, _ in ins if addr < a < int(m.group(1), 16))
    out = []
    for bottom, text, _ in ins:
        m = re.search(r"\bBRA\s+(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) <= bottom:
            top = int(m.group(1), 16)
            body = [(t, w) for a, t, w in ins if top <= a <= bottom and a not in fallback]
            out.append((top, bottom, body))
    return out


def regs(text):
    """(destinations, sources) of one SASS instruction, as register names."""
    guard = re.match(r"@!?(U?P\d)\s+", text)
    if guard:
        text = text[guard.end():]
    op, _, rest = text.partition(" ")
    operands = [o.strip() for o in rest.split(",")] if rest else []
    width = 1
    for suffix, w in ((".128", 4), (".64", 2), (".WIDE", 2), (".4", 4), (".2", 2)):
        if suffix in op:
            width = w
    names = lambda o: re.findall(r"\b(U?R\d+|U?P\d)\b", o)
    base = op.split(".")[0]
    no_dest = base in ("STS", "STG", "ST", "BAR", "BRA", "RED", "ATOM", "MEMBAR", "FENCE", "DEPBAR",
                       "WARPGROUP", "LDGSTS", "UTMALDG", "UTMASTG", "SYNCS", "BSSY", "BSYNC", "EXIT", "STSM")
    dests, srcs = [], [guard.group(1)] if guard else []
    for k, o in enumerate(operands):
        found = names(o)
        if k == 0 and not no_dest and not o.startswith("["):
            for r in found:
                dests.extend(expand(r, hgmma_width(op) if base == "HGMMA" else width))
            continue
        for r in found:
            srcs.extend(expand(r, width if base in ("STS", "STG") and not o.startswith("[") else 1))
    if base == "HGMMA" and len(operands) > 1:
        srcs.extend(expand(names(operands[1])[0], 4) if names(operands[1]) else [])
    return dests, srcs


def hgmma_width(op):
    m = re.search(r"64x(\d+)x", op)
    return int(m.group(1)) // 2 if m else 1


def expand(reg, width):
    m = re.match(r"(U?R)(\d+)$", reg)
    if not m or width == 1:
        return [reg]
    return [f"{m.group(1)}{int(m.group(2)) + k}" for k in range(width)]


def latency(op):
    base = op.split(".")[0]
    if base == "HGMMA":
        m = re.search(r"64x(\d+)x16", op)
        tensor = 64 * int(m.group(1)) * 16 // TENSOR_FMA_PER_CYCLE if m else 8
        return tensor + LATENCY["hgmma_fixed"], tensor
    table = {"HMMA": "hmma", "MUFU": "mufu", "SHFL": "shfl", "LDS": "lds", "LDSM": "ldsm", "STS": "sts", "LDG": "global",
             "BAR": "bar", "MEMBAR": "fence", "FENCE": "fence"}
    return LATENCY[table.get(base, "alu")], 0


def wavefronts(text):
    """The fewest shared-memory wavefronts one warp's instruction takes (see the docstring)."""
    op = opcode(text)
    base = op.split(".")[0]
    lane_bytes = 16 if ".128" in op else 8 if ".64" in op else 4
    if base in ("LDS", "STS"):
        return 32 * lane_bytes / WAVEFRONT_BYTES
    if base in ("LDSM", "STSM"):
        return 4 if op.endswith(".4") else 2 if op.endswith(".2") else 1
    if base == "LDGSTS":
        return 32 * lane_bytes / WAVEFRONT_BYTES
    if base == "HGMMA":
        m = re.search(r"64x(\d+)x16", op)
        n = int(m.group(1)) if m else 0
        # B (N x 16, 2 bytes each) from shared memory always, A (64 x 16) when a descriptor
        # holds it; the warpgroup's 4 warps issue the instruction, which reads them once.
        operands = re.sub(r"^@!?U?P\d\s+", "", text).partition(" ")[2].split(",")
        a_from_shared = len(operands) > 1 and operands[1].strip().startswith("gdesc")
        return (n * 16 * 2 + (64 * 16 * 2 if a_from_shared else 0)) / WAVEFRONT_BYTES / 4
    return 0


def estimate(body):
    """The latency bound of `body` ((instruction, source line) rows), its tensor cycles, and
    per source line the cycles it takes: its instructions' issue plus their waits."""
    ready = collections.defaultdict(int)
    # When the next `HGMMA` into the same accumulator may start: `wgmma`s accumulating into one
    # set of registers pipeline in the tensor cores, each starting once the previous has had
    # its tensor cycles (assumed: a GEMM's main loop reaches the tensor cores' peak with
    # back-to-back `wgmma`s into one accumulator); anything else waits for the whole latency.
    accumulating = collections.defaultdict(int)
    issue, last_done, tensor, copies_done = 0, 0, 0, 0
    by_line = collections.Counter()
    for text, where in body:
        dests, srcs = regs(text)
        op = opcode(text)
        lat, cycles = latency(op)
        tensor += cycles
        hgmma = op.startswith("HGMMA")
        waits = [accumulating[r] if hgmma and r in dests else ready[r] for r in srcs]
        start = max([issue + 1] + waits)
        if op.startswith("BAR") or op.startswith("WARPGROUP.DEPBAR"):
            start = max(start, last_done)
        if op.startswith("DEPBAR"):
            # `cp.async.wait_group`: the copies this iteration issued must land (those of
            # earlier iterations are taken as landed).
            start = max(start, copies_done)
        by_line[where] += start - issue
        issue = start
        if op.startswith("LDGSTS"):
            copies_done = max(copies_done, start + LATENCY["global"])
        done = start + lat
        for r in dests:
            ready[r] = done
            if hgmma:
                accumulating[r] = start + cycles
        last_done = max(last_done, done)
    return issue, tensor, by_line


def option(argv, name):
    """The value of `name` in `argv` (removed from it), or None."""
    if name not in argv:
        return None
    i = argv.index(name)
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


def every_variant():
    """One line per shipped variant: registers, spill stores and its busiest loop's length."""
    kda = os.path.join("target", "release", "kda")
    listing = subprocess.run([kda, "list"], check=True, capture_output=True, text=True).stdout
    for row in listing.splitlines():
        fields = row.split()
        if len(fields) < 2:
            continue
        family, config = fields[0], fields[1]
        target = "sm_90a" if "[sm_90a]" in fields else "sm_80"
        rows, log, _ = sass_of([family, config, "--target", target])
        used = re.search(r"Used (\d+) registers", log)
        spill = re.search(r"(\d+) bytes spill stores", log)
        busiest = max((len(body) for _, _, body in loops(rows)), default=0)
        print(f"{family:<12} {config:<78} {target:<7} registers {used.group(1) if used else '?':>3}"
              f"  spills {spill.group(1) if spill else '?':>3}  loop {busiest:>5}")


def main(argv):
    if argv == ["--all"]:
        return every_variant()
    warps, at, lines = option(argv, "--warps"), option(argv, "--at"), int(option(argv, "--lines") or 12)
    if not argv:
        sys.exit(__doc__)
    rows, log, threads = sass_of(argv)
    warps = int(warps) if warps else (threads // 32 if threads else None)
    found = loops(rows)
    for top, bottom, body in found:
        print(f"loop {top:#x}..{bottom:#x}: {len(body)} instructions")
    chosen = [f for f in found if at is None or f[0] == int(at, 16)]
    if not chosen:
        sys.exit("no such loop in the SASS")
    top, bottom, body = max(chosen, key=lambda f: len(f[2]))
    print(f"taken: {top:#x}..{bottom:#x}")
    for line in log.splitlines():
        if "registers" in line or "spill" in line:
            print("ptxas:", line.split(":", 1)[-1].strip())
    mix = collections.Counter(op_class(opcode(t)) for t, _ in body)
    print(f"loop: {len(body)} instructions a warp per iteration")
    for name, count in mix.most_common():
        print(f"  {name:<8} {count}")
    per_line = collections.defaultdict(collections.Counter)
    for t, where in body:
        per_line[where][op_class(opcode(t))] += 1
    print("the source lines with the most instructions:")
    for where, classes in sorted(per_line.items(), key=lambda kv: -sum(kv[1].values()))[:lines]:
        file, line = where or ("?", 0)
        parts = " ".join(f"{name} {n}" for name, n in classes.most_common())
        print(f"  {sum(classes.values()):>6} instructions  {file}:{line}  ({parts})")
    chain, tensor, by_line = estimate(body)
    print(f"latency bound (one warp, in order): {chain} cycles; the source lines taking most:")
    for (where, cycles) in by_line.most_common(lines):
        file, line = where or ("?", 0)
        print(f"  {cycles:>6} cycles  {file}:{line}")
    if warps:
        groups = max(warps // 4, 1)
        # A warp keeps to one scheduler: fewer than 4 warps leave some idle.
        print(f"issue bound ({warps} warps on 4 schedulers): {len(body) * max(warps, 4) // 4} cycles")
        print(f"tensor bound ({groups} warpgroup(s)): {tensor * groups} cycles")
        shared = sum(wavefronts(t) for t, _ in body)
        print(f"shared bound ({warps} warps, conflict-free): {round(shared * warps)} cycles "
              f"({shared:.0f} wavefronts a warp); the source lines taking most:")
        by_line = collections.Counter()
        for t, where in body:
            by_line[where] += wavefronts(t)
        for (where, w) in by_line.most_common(lines):
            file, line = where or ("?", 0)
            print(f"  {w:>6.0f} wavefronts  {file}:{line}  {' '.join(sorted({opcode(t) for t, x in body if x == where and wavefronts(t)}))}")
    else:
        print("issue bound: give --warps (no .reqntid in the PTX)")


if __name__ == "__main__":
    main(sys.argv[1:])
