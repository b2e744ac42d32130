"""Learning rate as a function of tokens seen (pure).

Schedules are defined in tokens, not steps, so trials at different batch sizes share one
schedule shape and can be compared at equal tokens. The trainer evaluates the schedule at the
tokens seen *after* the update it is about to apply, so the first update already has a
non-zero learning rate and the last one lands exactly on the end of the budget.

    warmup : lr rises linearly from 0 to `peak` over `warmup_tokens`
    then   : cosine | linear | wsd | constant down to `min_lr_ratio x peak`
             (wsd = warmup, stable at the peak, then a linear decay over the final
             `wsd_decay_share` of the budget)
"""

from __future__ import annotations

import math

DECAYS = ("cosine", "linear", "wsd", "constant")


def lr_at(
    tokens: float,
    *,
    peak: float,
    total_tokens: int,
    warmup_tokens: int = 0,
    decay: str = "cosine",
    min_lr_ratio: float = 0.1,
    wsd_decay_share: float = 0.2,
) -> float:
    """Learning rate after `tokens` tokens of a run with budget `total_tokens`."""
    if decay not in DECAYS:
        raise ValueError(f"unknown decay {decay!r}; valid: {', '.join(DECAYS)}")
    if warmup_tokens > 0 and tokens < warmup_tokens:
        return peak * max(tokens, 0.0) / warmup_tokens
    floor = peak * min_lr_ratio
    if decay == "constant":
        return peak
    decay_start = decay_start_tokens(total_tokens, warmup_tokens, decay, wsd_decay_share)
    span = total_tokens - decay_start
    if tokens <= decay_start or span <= 0:
        return peak
    progress = min((tokens - decay_start) / span, 1.0)
    if decay == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:  # linear, and the decay phase of wsd
        shape = 1.0 - progress
    return floor + (peak - floor) * shape


def decay_start_tokens(
    total_tokens: float, warmup_tokens: float = 0, decay: str = "cosine", wsd_decay_share: float = 0.2
) -> float:
    """Where the lr starts to fall: the end of warmup for cosine and linear, the last
    `wsd_decay_share` of the budget for wsd (not before warmup ends), never for constant."""
    if decay == "constant":
        return total_tokens
    if decay == "wsd":
        return max(warmup_tokens, total_tokens * (1.0 - wsd_decay_share))
    return warmup_tokens


TRUSTED_SHARE = 0.5
"""cosine and linear decay from the end of warmup: steps-to-target are read in this first share
of the budget only (the report then warns that the answer depends on the schedule)."""


def stable_end_tokens(total_tokens: int, warmup_tokens: int = 0, decay: str = "cosine", wsd_decay_share: float = 0.2):
    """Where the part of a run ends whose progress the schedule cannot fake: the start of wsd's
    decay, the whole run for constant, TRUSTED_SHARE of the budget for cosine and linear. Steps
    to a target loss are read before it (a final anneal would reach the lowest targets at the end
    of every run, whatever its batch size); the trainer evaluates there (`stable_loss`)."""
    if decay not in DECAYS:
        raise ValueError(f"unknown decay {decay!r}; valid: {', '.join(DECAYS)}")
    if decay == "wsd":
        return max(warmup_tokens, int(total_tokens * (1.0 - wsd_decay_share)))
    if decay == "constant":
        return total_tokens
    return max(warmup_tokens, int(TRUSTED_SHARE * total_tokens))
