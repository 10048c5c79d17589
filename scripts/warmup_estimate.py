#!/usr/bin/env python3
"""How many chunks of warm-up a piece of a long sequence would need, with the bench's gates.

    python3 scripts/warmup_estimate.py [HEADS]        (needs numpy)

A split that starts a piece from a zero state `w` chunks before its first token, instead of
from the exact state the previous piece left (transitions and a merge), is exact up to the
state's contribution carried across the warm-up. With l2-normalized keys and beta in (0, 1)
(or 2·sigmoid, up to 2) that contribution is bounded by the product over the warm-up chunks of
`max_d exp(sum of the chunk's gates in channel d)` times sqrt(D) (the "seed truncation" of
cuDNN-frontend's Hopper KDA kernel); the warm-up is long enough once the bound is below 2^-20. This script draws heads as `kda bench` and the peers' scripts do (lower-bound gate with
lower_bound = -5, `A_log ~ U(0, 2.8)` per head, `dt_bias ~ N(0, 1)` per channel, the raw gate
`~ N(0, 1)` per token and channel) and prints, for each warm-up length, the share of heads
whose bound passes within it; then the median length by `A_log`. A head whose channels barely
decay never passes, and would take the exact split.
"""

import sys

import numpy as np

D, CHUNK, LOWER_BOUND = 128, 16, -5.0
LIMIT = 2048  # chunks tried before a head is counted as never passing
TARGET = -(20 * np.log(2) + 0.5 * np.log(D))  # ln(2^-20 / sqrt(D))


def warmup_chunks(rng):
    """The head's `A_log` and the chunks its bound needs (None: more than LIMIT)."""
    a_log = rng.random() * 2.8
    dt_bias = rng.standard_normal(D)
    ea, total = np.exp(a_log), 0.0
    for w in range(1, LIMIT + 1):
        x = rng.standard_normal((CHUNK, D))
        g = LOWER_BOUND / (1 + np.exp(-ea * (x + dt_bias)))
        total += np.max(g.sum(axis=0))
        if total <= TARGET:
            return a_log, w
    return a_log, None


def main(heads):
    rng = np.random.default_rng(0)
    drawn = [warmup_chunks(rng) for _ in range(heads)]
    need = np.array([w if w is not None else LIMIT + 1 for _, w in drawn])
    a_log = np.array([a for a, _ in drawn])
    print(f"{heads} heads, bound 2^-20 with sqrt(D), D = {D}, chunk {CHUNK}")
    print("| warm-up (chunks) | heads passing |")
    print("|---|---|")
    for limit in (1, 2, 4, 8, 16, 64, 256, LIMIT):
        print(f"| {limit} | {np.mean(need <= limit):.0%} |")
    print("| A_log | median chunks | passing within 256 |")
    print("|---|---|---|")
    for lo in (0.0, 0.7, 1.4, 2.1):
        m = (a_log >= lo) & (a_log < lo + 0.7)
        if not m.any():
            continue
        median = np.median(need[m])
        shown = "never" if median > LIMIT else f"{median:.0f}"
        print(f"| [{lo:.1f}, {lo + 0.7:.1f}) | {shown} | {np.mean(need[m] <= 256):.0%} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
