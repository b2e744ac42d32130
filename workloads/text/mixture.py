"""Which source each sequence of the training stream comes from (pure arithmetic, numpy only).

The stream is one fixed sequence of packed sequences: sequence k is the same in every run of a
data config and seed, whatever the batch size, and update u consumes sequences [u N, (u+1) N).
Sources are assigned along the stream so that every prefix of n sequences holds source i
between floor(n w_i) and ceil(n w_i) times: within one sequence of its weight, at every n.
A per-update rounding of the weights could never promise that (a 4-sequence update cannot hold
a 10% source), and would make the mixture depend on the batch size.

How: the normalised weights are exact fractions p_i / Q (decimal weights such as 0.45 are
exact; others are rounded to 1/MAX_PERIOD). One period of Q positions is laid out by earliest
deadline first: source i's k-th sequence may not come before position floor((k-1) Q / p_i) + 1
(else it would exceed ceil(n w_i)) and must come by position ceil(k Q / p_i) (else it would
fall below floor(n w_i)); among the sources allowed at a position, the one with the earliest
deadline goes first. For unit-length jobs with integer release times and deadlines, earliest
deadline first meets every deadline whenever any order does, and one does (Tijdeman 1980, the
chairman assignment problem). After Q positions every source has exactly p_i sequences, so
the period repeats and sequence k's source is a table lookup: no history, any k.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import Sequence, Tuple

import numpy as np

MAX_PERIOD = 1 << 16
"""Longest period laid out; weights needing a longer one are rounded to multiples of 1/MAX_PERIOD."""


@lru_cache(maxsize=16)
def _shares(weights: Tuple[float, ...]) -> Tuple[int, ...]:
    if not weights or any(not w > 0 for w in weights):
        raise ValueError(f"weights must be positive, got {list(weights)}")
    exact = [Fraction(repr(w)) for w in weights]  # 0.45 -> 9/20, not the binary float
    total = sum(exact)
    period = math.lcm(*(f.denominator for f in (e / total for e in exact)))
    if period <= MAX_PERIOD:
        return tuple(int(e / total * period) for e in exact)
    # Rounded to MAX_PERIOD: nearest shares, every source keeping at least one position.
    quota = np.array([float(e / total) for e in exact]) * MAX_PERIOD
    counts = np.maximum(np.floor(quota), 1).astype(np.int64)
    while counts.sum() < MAX_PERIOD:
        counts[int(np.argmax(quota - counts))] += 1
    while counts.sum() > MAX_PERIOD:
        counts[int(np.argmax(np.where(counts > 1, counts - quota, -np.inf)))] -= 1
    return tuple(int(c) for c in counts)


def shares(weights: Sequence[float]) -> Tuple[int, ...]:
    """Integer shares p_i of one period (sum = the period Q) for positive weights (any scale:
    pass them as configured, not normalised to floats, so that 7 and 2 stay exactly 7/9)."""
    return _shares(tuple(float(w) for w in weights))


@lru_cache(maxsize=16)
def period(p: Tuple[int, ...]) -> Tuple[np.ndarray, np.ndarray]:
    """(source of each position of one period, that source's count before the position)."""
    q, m = sum(p), len(p)
    sources = np.empty(q, np.int64)
    ranks = np.empty(q, np.int64)
    taken = [0] * m
    for n in range(1, q + 1):  # 1-based positions
        best, best_deadline = -1, None
        for i in range(m):
            if taken[i] * q < n * p[i]:  # one more keeps source i within ceil(n p_i / q)
                deadline = -(-(taken[i] + 1) * q // p[i])
                if best_deadline is None or deadline < best_deadline:
                    best, best_deadline = i, deadline
        sources[n - 1], ranks[n - 1] = best, taken[best]
        taken[best] += 1
    sources.setflags(write=False)
    ranks.setflags(write=False)
    return sources, ranks


def assign(weights: Sequence[float], positions: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(source, per-source counter) of stream positions k: the counter is how many sequences of
    that source come before k, so each source's own sequences are consumed in order, none twice."""
    p = shares(weights)
    sources, ranks = period(p)
    k = np.asarray(positions, np.int64)
    cycle, offset = np.divmod(k, len(sources))
    source = sources[offset]
    return source, cycle * np.asarray(p, np.int64)[source] + ranks[offset]
