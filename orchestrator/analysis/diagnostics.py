"""What can make the report refuse to trust a B_crit: the notes beside each target (a best lr at
an edge, the optimizer's start-up, clipping that differs between batch sizes, a schedule that
fakes progress, no B_simple) and the trend of B_crit across targets beside B_simple's. Pure.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from orchestrator.analysis import critical_batch as cb
from orchestrator.analysis.answer import TargetFit, Trend
from orchestrator.analysis.trials import Trial
from orchestrator.formulas.schedules import TRUSTED_SHARE

CLIP_SPREAD = 0.25
"""Warn when the share of clipped updates before a target differs by more than this between B."""
PRECISION = 0.2
"""A B_crit whose 90 % interval does not hold it to within this share is `imprecise`."""
WARMUP_FACTOR = 3.0
"""Warn when E_min is within this many times the warmup tokens."""
UNINTERPOLATED = {
    "one-sided": "a neighbouring lr failed or never reached this loss, so the optimum was extrapolated from "
    "the other side (at most half a grid step past the best lr tried)",
    "not interpolated": "no concave parabola passes through the best lr and its neighbours, so it is the best lr tried",
}
"""Why an lr optimum inside the grid is no interpolation (orchestrator/analysis/lr_optimum.py)."""


def imprecise(fit: TargetFit) -> bool:
    if fit.b_crit is None or fit.b_crit_interval is None:
        return False
    low, high = fit.b_crit_interval
    return max(high / fit.b_crit, fit.b_crit / low) > 1 + PRECISION


def notes(usable: Sequence[Trial], fit: TargetFit) -> List[str]:
    """Why not to trust the fit at one target, for people (its flags say it for machines)."""
    notes, points, missing = [], fit.points, fit.missing
    bound = [p for p in points if p.lr_edge in ("lowest", "highest")]
    for side in ("lowest", "highest"):
        at = [f"{p.batch:,}" for p in bound if p.lr_edge == side]
        if at:
            notes.append(
                f"steps at B = {', '.join(at)} are upper bounds: the best lr there is the {side} tried "
                f"(search.algorithm: bracket extends the lrs until the best is inside)"
            )
    for word, why in UNINTERPOLATED.items():
        at = [f"{p.batch:,}" for p in points if p.lr_edge == word]
        if at:
            notes.append(
                f"the best lr at B = {', '.join(at)} is {word}: {why}; the steps there carry the lr grid's spacing "
                "as their uncertainty, in the fit and in the interval"
            )
    if imprecise(fit):
        notes.append(
            f"imprecise: the interval does not hold B_crit to within {PRECISION:.0%}; more seeds (search.seeds), "
            "batch sizes or a finer lr grid narrow it"
        )
    if missing:
        notes.append("not reached by batch sizes " + ", ".join(f"{b:,}" for b in missing))
    warmup = max((t.warmup_tokens for t in usable), default=0.0)
    if fit.e_min is not None and warmup and fit.e_min < WARMUP_FACTOR * warmup:
        notes.append(
            f"E_min = {fit.e_min:,.0f} tokens is within {WARMUP_FACTOR:g}x the warmup ({warmup:,.0f} tokens): "
            "the regime may still be the optimizer's start-up"
        )
    largest = max(usable, key=lambda t: t.batch)
    if fit.s_min is not None and largest.beta2 and largest.beta2 < 1:
        memory = 1 / (1 - largest.beta2)
        if fit.s_min < memory:
            notes.append(
                f"S_min = {fit.s_min:.3g} steps is below Adam's beta2 memory (1 / (1 - beta2) = {memory:.3g} "
                "updates): steps this few measure the optimizer's start-up, not the gradient noise"
            )
    shares = [p.clipped for p in points if p.clipped is not None]
    if len(shares) >= 2 and max(shares) - min(shares) > CLIP_SPREAD:
        notes.append(
            f"clipped updates before this loss range from {min(shares):.0%} to {max(shares):.0%} across batch sizes: "
            "clipping shortens the noisier small-batch steps more (raise optim.grad_clip or lower the lr)"
        )
    schedules = {t.params.get("schedule.decay") for t in usable} & {"cosine", "linear"}
    if schedules:
        notes.append(
            f"steps read before {TRUSTED_SHARE:.0%} of the budget ({'/'.join(sorted(schedules))} decay from the "
            "end of warmup): the fit depends on the schedule; wsd or constant give one it cannot fake"
        )
    if not any(p.b_simple is not None for p in points):
        notes.append("no gns/b_simple at this loss (gns.enabled=false, or B_simple was not measured)")
    return notes


def flags(fit: TargetFit) -> Tuple[str, ...]:
    """What marks a B_crit, for machines (the notes say it for people): `lack_of_fit` (the
    hyperbola does not describe the points), `imprecise` (its interval does not hold it to within
    PRECISION), `lr_bound` (the best lr of a point is at an edge of
    the lrs tried: its steps are an upper bound), `lr_not_interpolated` (a point's best lr is
    one-sided or the best tried: its steps carry the grid's spacing as their uncertainty)."""
    words = {p.lr_edge for p in fit.points}
    marks = [("lack_of_fit", fit.lack_of_fit.flagged), ("imprecise", imprecise(fit))]
    marks += [
        ("lr_bound", bool(words & {"lowest", "highest"})),
        ("lr_not_interpolated", bool(words & set(UNINTERPOLATED))),
    ]
    return tuple(name for name, on in marks if on)


def trend(
    fits: Sequence[TargetFit], resolved: List[int], boot: Optional[Sequence[Optional[np.ndarray]]], targets
) -> Trend:
    """Slopes of log B_crit and log B_simple on log target loss (negative: they rise as the loss
    falls), over the `resolved` fits; `boot`: each fit's bootstrap B_crit (None without one)."""
    on = tuple(targets[i] for i in resolved)
    if len(resolved) < 2:
        return Trend(on, None, None, None, None, f"no trend: it needs 2 resolved targets; {len(resolved)} resolved")
    xs = list(on)
    b_crit_slope = float(cb.slope(xs, np.array([fits[i].b_crit for i in resolved])))
    interval = None
    if all(boot[i] is not None for i in resolved):
        interval = cb.percentile_interval(cb.slope(xs, np.stack([boot[i] for i in resolved], -1)))
    measured = [(fits[i].target_loss, fits[i].b_simple) for i in resolved if fits[i].b_simple]
    if len(measured) < 2:
        return Trend(on, b_crit_slope, interval, None, None, None)
    b_simple_slope = float(cb.slope([m[0] for m in measured], np.array([m[1] for m in measured])))
    # Opposite signs count when B_crit's direction is settled (its interval excludes 0), or,
    # without an interval, when the two point slopes differ in sign.
    lo, hi = interval or (b_crit_slope, b_crit_slope)
    settled = np.sign(lo) == np.sign(hi) != 0
    agree = bool(not settled or np.sign(lo) == np.sign(b_simple_slope))
    note = (
        None
        if agree
        else "B_crit and B_simple move in opposite directions as the loss falls; theory (McCandlish et al. 2018, "
        "Kaplan et al. 2020) has both rise: distrust the B_crit trend"
    )
    return Trend(on, b_crit_slope, interval, b_simple_slope, agree, note)
