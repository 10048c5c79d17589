#!/usr/bin/env python3
"""How many chunks of warm-up a piece of a long sequence would need, with the bench's gates.

    python3 scripts/warmup_estimate.py [HEADS]        (needs numpy)

A split that starts a piece from a zero state `w` chunks before its first token, instead of
from the exact state the previous piece left (transitions and a merge), is exact up to the
state's contribution carried across the warm-up. Two bounds on that contribution, each times
sqrt(D); the warm-up is long enough once the bound is below 2^-20:

- per chunk: the product over the warm-up chunks of `max_d exp(sum of the chunk's gates in
  channel d)` (the "seed truncation" of cuDNN-frontend's Hopper KDA kernel). It is not a bound
  in general: a token's `I - beta k kᵀ` mixes channels, so a channel that decays early in the
  chunk can receive what another channel kept, then not decay.
- per token: the product over the warm-up tokens of `max_d exp(g_{t,d})`, which is one. With
  l2-normalized keys and beta in [0, 2] (sigmoid or 2·sigmoid) every `I - beta k kᵀ` has
  spectral norm at most 1 and every gate step is diagonal, so the product of their norms
  bounds the carried state's.

The script draws heads as `kda bench` and the peers' scripts do (lower-bound gate with
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


BLOCK = 64  # chunks drawn at once


def first_passing(log_bound):
    """The first chunk (1-based) whose running sum of `log_bound` reaches TARGET, else None."""
    hit = np.nonzero(np.cumsum(log_bound) <= TARGET)[0]
    return int(hit[0]) + 1 if hit.size else None


def warmup_chunks(rng):
    """The head's `A_log` and the chunks each bound needs (per chunk, per token; None: more
    than LIMIT)."""
    a_log = rng.random() * 2.8
    dt_bias = rng.standard_normal(D)
    ea = np.exp(a_log)
    per_chunk, per_token = [], []
    for _ in range(LIMIT // BLOCK):
        x = rng.standard_normal((BLOCK, CHUNK, D))
        g = LOWER_BOUND / (1 + np.exp(-ea * (x + dt_bias)))
        per_chunk.append(g.sum(axis=1).max(axis=1))
        per_token.append(g.max(axis=2).sum(axis=1))
        if first_passing(np.concatenate(per_token)) is not None:
            break
    return a_log, first_passing(np.concatenate(per_chunk)), first_passing(np.concatenate(per_token))


def main(heads):
    rng = np.random.default_rng(0)
    drawn = [warmup_chunks(rng) for _ in range(heads)]
    a_log = np.array([d[0] for d in drawn])
    needs = [np.array([w if w is not None else LIMIT + 1 for w in col]) for col in zip(*[d[1:] for d in drawn])]
    print(f"{heads} heads, bound 2^-20 with sqrt(D), D = {D}, chunk {CHUNK}")
    print("| warm-up (chunks) | heads passing, per chunk | per token |")
    print("|---|---|---|")
    for limit in (1, 2, 4, 8, 16, 64, 256, LIMIT):
        print(f"| {limit} | {np.mean(needs[0] <= limit):.0%} | {np.mean(needs[1] <= limit):.0%} |")
    print("| A_log | median chunks, per chunk | per token | within 256, per chunk | per token |")
    print("|---|---|---|---|---|")
    for lo in (0.0, 0.7, 1.4, 2.1):
        m = (a_log >= lo) & (a_log < lo + 0.7)
        if not m.any():
            continue
        medians = [np.median(need[m]) for need in needs]
        shown = ["never" if x > LIMIT else f"{x:.0f}" for x in medians]
        within = [f"{np.mean(need[m] <= 256):.0%}" for need in needs]
        print(f"| [{lo:.1f}, {lo + 0.7:.1f}) | {shown[0]} | {shown[1]} | {within[0]} | {within[1]} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
