"""The critical batch size measured by branching from checkpoints (pure: numpy and scipy).

Merrill et al. 2025 ("Critical Batch Size Revisited") measure the critical batch size *at a point
of training* instead of as an average over a from-scratch sweep: from a checkpoint of a base run
at t tokens (base batch B0 tokens per update) short continuations ("branches") are trained at
k x B0 for a few factors k, the learning rate scaled by k^alpha, each for the same number of
tokens; the critical batch size at t is the largest branch batch whose loss at the end of the
branch is within a relative tolerance of the factor-1 branch. A batch at or below it makes
(almost) the same progress per token as the base batch, so it takes fewer steps for free.

This module is the arithmetic of that measurement: the crossing of the tolerance at one branch
point (`critical_batch_at`) with a parametric bootstrap interval, and the same along the branch
points (`critical_batch_along`); the trend along training and the batch ramp it suggests are
orchestrator/analysis/branch_ramp.py. No Ray, MLflow or DeepSpeed here: callers read the branch ends from
wherever the runs logged them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from orchestrator.analysis.critical_batch import INTERVAL_LEVEL, percentile_interval

DEFAULT_TOLERANCE = 0.01
"""1 % relative excess loss over the factor-1 branch: Merrill et al.'s order of magnitude, and
(with the eval set sized to make the tolerance at least three standard errors) large enough that
eval noise alone rarely crosses it. A stated choice, not a law: the report names it."""

RELATIVE, ABSOLUTE = "relative", "absolute"
REFERENCE, EVERY_SMALLER = "reference", "every_smaller"


@dataclass(frozen=True)
class Tolerance:
    """How far a branch's end loss may exceed a smaller batch's and still count as within the
    critical batch size (`branch.tolerance`, `branch.tolerance_kind`, `branch.compare`).

    `kind` relative (the default): a share of the smaller batch's loss, so one number means the
    same on any task, tokenizer or loss scale; its cost is that the threshold in loss grows with
    the irreducible part of the loss. absolute: in loss units (Merrill et al. 2025 use an absolute
    epsilon), independent of the irreducible loss but to be chosen per task. `compare` reference
    (the default): each batch against the factor-1 branch; every_smaller (Merrill et al.'s rule): a
    batch is within only if it is within the tolerance of every smaller batch, so a smaller batch
    that did better than the reference by noise raises the bar for the batches above it."""

    value: float = DEFAULT_TOLERANCE
    kind: str = RELATIVE
    compare: str = REFERENCE

    def __post_init__(self):
        if self.kind not in (RELATIVE, ABSOLUTE) or self.compare not in (REFERENCE, EVERY_SMALLER):
            raise ValueError(f"tolerance kind {self.kind!r} (relative, absolute), compare {self.compare!r}")
        top = 1.0 if self.kind == RELATIVE else math.inf
        if not 0 < self.value < top:
            raise ValueError(f"a {self.kind} tolerance is in (0, {top:g}), got {self.value}")

    def excess(self, means: np.ndarray) -> np.ndarray:
        """Per row of mean losses [..., K] (smallest batch first), each batch's excess over the
        batch it is compared with, in the tolerance's units (column 0 is 0). A diverged mean (inf)
        has an infinite excess."""
        if self.compare == EVERY_SMALLER:  # the worst is the excess over the lowest smaller loss
            best_below = np.minimum.accumulate(means, axis=-1)
            against = np.concatenate([means[..., :1], best_below[..., :-1]], -1)
        else:
            against = np.broadcast_to(means[..., :1], means.shape)
        with np.errstate(invalid="ignore"):
            gap = means - against
            return gap / against if self.kind == RELATIVE else gap

    def words(self) -> str:
        """The rule as the report says it."""
        amount = f"{self.value:.2%}" if self.kind == RELATIVE else f"{self.value:g} in loss"
        return f"within {amount} of " + (
            "every smaller branch's" if self.compare == EVERY_SMALLER else "the factor-1 branch's"
        )


def tolerance_of(value: Union[float, Tolerance, None]) -> Tolerance:
    """A Tolerance from a bare number (relative, against the reference), one, or None (the default)."""
    return value if isinstance(value, Tolerance) else Tolerance(DEFAULT_TOLERANCE if value is None else float(value))


SE_PER_TOLERANCE = 3
"""The eval set should make the tolerance at least this many standard errors of the eval loss,
so that eval noise alone seldom moves a branch across it."""

DEFAULT_DRAWS = 2000
"""Bootstrap draws per branch point: the 5th and 95th percentiles of 2000 draws move by well
under a grid step of the factors from one seed to another."""

RESOLVED, ABOVE, BELOW, NOT_RESOLVED = "resolved", "above", "below", "not resolved"


@dataclass(frozen=True)
class BranchEnd:
    """One branch's result: the loss it reached at the end of its tokens.

    All branches of one branch point train the same number of tokens from the same checkpoint,
    so their end losses compare progress per token at different batch sizes, which is what the
    critical batch size is about; the number of tokens itself is not needed here."""

    at_tokens: int
    """The branch point t: tokens the base run had seen at the checkpoint."""
    batch: int
    """The branch's tokens per update (factor x the base's B0); the smallest of a branch point
    is the reference (factor 1)."""
    loss: float
    """Its loss at the end of the branch: eval loss, or smoothed train loss (the caller says
    which in the report). NaN or infinity: the branch diverged, worse than any loss."""
    loss_se: float = 0.0
    """Standard error of that loss (eval noise over the held-out set, or over seeds); 0 if
    unknown. The bootstrap redraws the loss from N(loss, loss_se)."""
    seed: int = 0
    """Several seeds of the same (t, batch) are replicates: averaged, and their spread is part
    of the interval."""
    b_simple: Optional[float] = None
    """B_simple measured at t on the base run, if any: shown beside the branched value."""


# ---------------------------------------------------------------- one branch point


def _crossings(
    log_batches: np.ndarray, excess: np.ndarray, tolerance: float
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rule, per row of `excess` [..., K] (Tolerance.excess, so column 0 is 0): walk up from
    the smallest batch while the excess is within tolerance; the first batch beyond it is the
    crossing, and the critical batch is where the straight line in log B between the last batch
    within and the first beyond reaches the tolerance. Batches past
    the first beyond are not read, even if noise brings one back within: the rule takes the
    first crossing from below after the run of within-tolerance batches from the smallest.
    Returns (code, log cbs, the index of the last batch within): code 0 resolved, 1 above (no
    batch beyond), -1 below (the second smallest already beyond); log cbs is NaN unless resolved."""
    e = np.where(np.isnan(excess), np.inf, excess)  # a diverged branch is beyond any tolerance
    beyond = e > tolerance
    any_beyond = beyond.any(-1)
    j = np.argmax(beyond, -1)  # first beyond (0 where none)
    code = np.where(~any_beyond, 1, np.where(j == 1, -1, 0))
    jj = np.clip(j, 1, None)
    e_lo = np.take_along_axis(e, (jj - 1)[..., None], -1)[..., 0]
    e_hi = np.take_along_axis(e, jj[..., None], -1)[..., 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(np.isinf(e_hi), 0.0, (tolerance - e_lo) / (e_hi - e_lo))
    log_cbs = log_batches[jj - 1] + frac * (log_batches[jj] - log_batches[jj - 1])
    return code, np.where(code == 0, log_cbs, np.nan), jj - 1


def _not_resolved(tokens: int, reason: str, tolerance: Tolerance, **rest: Any) -> Dict[str, Any]:
    out = {
        "tokens": tokens,
        "cbs": None,
        "cbs_interval": None,
        "status": NOT_RESOLVED,
        "reason": reason,
        "reference_loss": None,
        "batches": [],
        "losses": [],
        "excess": [],
        "seeds": [],
        "tolerance": tolerance.value,
        "tolerance_kind": tolerance.kind,
        "compare": tolerance.compare,
        "b_simple": None,
        "resolved_share": None,
        "draw_shares": None,
        "interval_from": None,
        "interval_level": INTERVAL_LEVEL,
    }
    out.update(rest)
    return out


def eval_tokens_needed(
    ends: Sequence[BranchEnd], tolerance: Union[float, Tolerance], eval_tokens: int
) -> Optional[int]:
    """The eval set that makes the tolerance SE_PER_TOLERANCE of the branches' median eval
    standard error (relative to the loss for a relative tolerance), which falls as 1 / sqrt(eval
    tokens); None when the eval set is large enough already or no branch has a standard error."""
    tol = tolerance_of(tolerance)
    errors = [
        e.loss_se / e.loss if tol.kind == RELATIVE else e.loss_se
        for e in ends
        if e.loss_se > 0 and math.isfinite(e.loss) and e.loss > 0
    ]
    if not errors:
        return None
    needed = eval_tokens * (SE_PER_TOLERANCE * float(np.median(errors)) / tol.value) ** 2
    return math.ceil(needed) if needed > eval_tokens else None


def _generator(rng: Union[None, int, np.random.Generator]) -> np.random.Generator:
    """A fixed seed by default, so that the same runs give the same report."""
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(0 if rng is None else rng)


def critical_batch_at(
    ends: Sequence[BranchEnd],
    tolerance: Union[float, Tolerance] = DEFAULT_TOLERANCE,
    draws: int = DEFAULT_DRAWS,
    rng: Union[None, int, np.random.Generator] = None,
) -> Dict[str, Any]:
    """The critical batch size at ONE branch point, from its branches' end losses.

    The reference is the smallest batch (factor 1); each batch's loss is its mean over seeds,
    and its excess is by the Tolerance's rule (by default relative to the factor-1 loss,
    (L_k - L_1) / L_1). The critical batch is where the excess crosses the tolerance,
    interpolated linearly in log B between the last batch within tolerance and the first beyond
    it, walking up from the smallest batch (so the first crossing from below after the run of
    within-tolerance batches from the smallest: the excess should rise with B, and a noisy dip
    back within tolerance at a larger batch is not read). A diverged branch (NaN or
    infinite loss) counts as beyond tolerance, so the crossing is then read at the batch before
    it: nothing tells how far between the two the excess reached the tolerance.

    Status, and what `cbs` then means:
      - resolved: the crossing lies between two tried batches, the second smallest within
        tolerance: `cbs` is the interpolated crossing.
      - above: every batch is within tolerance; `cbs` is the largest batch tried, a LOWER bound
        (the critical batch is at least that).
      - below: the second smallest batch (factor 2) is already beyond tolerance; `cbs` is that
        batch, an UPPER bound (the critical batch is under it, maybe even under the base batch,
        which the branches cannot tell since the reference is the base batch itself).
      - not resolved: nothing to compare (fewer than two batch sizes, or a reference loss that
        is not a positive number); `cbs` and the interval are None and `reason` says why.

    The interval (`cbs_interval`, the middle INTERVAL_LEVEL = 90 %) is a parametric bootstrap:
    each draw redraws every batch's mean loss, recomputes the crossing by the same rule, places it
    in its bracket (below), and the interval is the 5th and 95th percentiles of the draws. One
    seed: the loss is drawn from N(loss, loss_se). Several seeds: the mean is drawn from mean + s /
    sqrt(n) x T(n - 1), s the seeds' standard deviation (or the eval noise, the root mean square of
    their loss_se, when that is larger: the seeds' spread already contains the eval noise, so the
    two are not added) and T(n - 1) Student's t, what the mean of n normal seeds is known to within
    given their own spread. Resampling the seeds instead covers badly with the few seeds branches
    have: with four seeds its 90 % interval covered 77 % of the tests' experiments, this one 93 to
    96 % (two seeds: the t has one degree of freedom, and the interval is mostly unbounded, which is
    what two seeds can tell).
    The gap between factors is part of the interval: the straight line between the two batches
    that bracket the crossing is only a guess at the excess between them (on SGD over a noisy
    quadratic, tests/branch_truth.py, it put the crossing 4 % low to 5 % high, while the noise
    alone made intervals an eighth of the bracket wide), so each draw places its crossing in its
    bracket by a triangular
    distribution in log B over the bracket, peaked at the interpolated crossing: a crossing between
    two factors never has an interval narrower than what the factors can resolve, and a noise-free
    one has the bracket's.
    An `above` draw ranks above every resolved one and a `below` draw under every one, and an end
    of the interval that falls on such a draw is a bound, not a number: a lower end among `below`
    draws is None (no lower bound), a lower end among `above` draws is the largest batch; an upper
    end among `above` draws is None (no upper bound), an upper end among `below` draws is the
    second smallest batch. So an `above` point whose draws are all above reads [largest batch,
    None], a `below` one [None, factor-2 batch]; with no noise either has no interval.
    `draw_shares` gives the share of draws per status (`resolved_share` that of resolved ones).
    The draws treat the losses as independent: branches scored on one shared eval set have
    positively correlated eval errors, so the excess is less noisy than this assumes and the
    interval is conservative. A diverged seed makes its batch's mean diverged in every draw.

    `tolerance`: a Tolerance, or a number (relative, against the factor-1 branch).
    `rng`: a Generator, a seed, or None for seed 0 (the same runs give the same report).
    """
    tol = tolerance_of(tolerance)
    if not ends:
        raise ValueError("critical_batch_at needs the branches of one branch point, got none")
    points = {int(e.at_tokens) for e in ends}
    if len(points) != 1:
        raise ValueError(f"critical_batch_at takes one branch point, got branches at {sorted(points)} tokens")
    tokens = points.pop()
    simples = [float(e.b_simple) for e in ends if e.b_simple is not None and math.isfinite(e.b_simple)]
    b_simple = float(np.median(simples)) if simples else None
    groups: Dict[int, List[BranchEnd]] = defaultdict(list)
    for e in ends:
        if e.batch <= 0:
            raise ValueError(f"a branch batch is positive tokens per update, got {e.batch} at {tokens} tokens")
        if not e.loss_se >= 0:
            raise ValueError(f"loss_se is a standard error (>= 0), got {e.loss_se} at batch {e.batch}")
        groups[int(e.batch)].append(e)
    batches = sorted(groups)
    loss = [np.array([_finite_or_inf(e.loss) for e in groups[b]]) for b in batches]
    se = [np.array([float(e.loss_se) for e in groups[b]]) for b in batches]
    means = np.array([g.mean() for g in loss])
    seeds = [len(groups[b]) for b in batches]
    common = dict(batches=batches, losses=[float(m) for m in means], seeds=seeds, b_simple=b_simple)
    if len(batches) < 2:
        return _not_resolved(tokens, "one batch size: nothing to compare with the reference", tol, **common)
    reference = float(means[0])
    if not (math.isfinite(reference) and reference > 0):
        return _not_resolved(tokens, f"the reference (factor-1) loss is {reference}", tol, **common)
    excess = tol.excess(means)
    log_b = np.log(np.asarray(batches, np.float64))
    code, log_cbs, _ = _crossings(log_b, excess[None, :], tol.value)
    status = {0: RESOLVED, 1: ABOVE, -1: BELOW}[int(code[0])]
    cbs = {RESOLVED: float(np.exp(log_cbs[0])), ABOVE: float(batches[-1]), BELOW: float(batches[1])}[status]

    noisy = any(s.any() for s in se)
    replicated = any(n > 1 for n in seeds)
    sources = [w for w, on in (("eval noise", noisy), ("seeds", replicated), ("the gap between factors", True)) if on]
    interval: Optional[List[Optional[float]]] = None
    shares: Optional[Dict[str, float]] = None
    if (noisy or replicated or status == RESOLVED) and draws > 0:
        gen = _generator(rng)
        if noisy or replicated:
            drawn = np.stack([_draw_means(v, e, draws, gen) for v, e in zip(loss, se)], 1)
        else:
            drawn = np.broadcast_to(means, (draws, len(means)))
        interval, shares = _bootstrap_interval(batches, log_b, drawn, tol, gen)
    return {
        "tokens": tokens,
        "cbs": cbs,
        "cbs_interval": interval,
        "status": status,
        "reason": None,
        "reference_loss": reference,
        "batches": batches,
        "losses": common["losses"],
        "excess": [float(x) for x in excess],
        "seeds": seeds,
        "tolerance": tol.value,
        "tolerance_kind": tol.kind,
        "compare": tol.compare,
        "b_simple": b_simple,
        "resolved_share": None if shares is None else shares[RESOLVED],
        "draw_shares": shares,
        "interval_from": " and ".join(sources) if interval is not None else None,
        "interval_level": INTERVAL_LEVEL,
    }


def _bootstrap_interval(
    batches: Sequence[int], log_b: np.ndarray, drawn: np.ndarray, tol: Tolerance, gen: np.random.Generator
) -> Tuple[List[Optional[float]], Dict[str, float]]:
    """The interval and the share of draws per status from `drawn` [draws, batches] mean losses
    (the rule: critical_batch_at; `log_b` the batches' logs): each draw's crossing placed in its
    bracket, `above` and `below` draws ranked past every resolved one."""
    d_code, d_log, last = _crossings(log_b, tol.excess(drawn), tol.value)
    left, right = log_b[last], log_b[np.clip(last + 1, None, len(log_b) - 1)]
    mode = np.clip(np.nan_to_num(d_log, nan=0.0), left, right)
    placed = np.where(right > left, gen.triangular(left, mode, np.where(right > left, right, left + 1.0)), left)
    ranked = np.where(d_code == 1, np.inf, np.where(d_code == -1, -np.inf, np.exp(placed)))
    valid = drawn[:, 0] > 0  # a drawn reference loss <= 0 (a far tail of few seeds) has no relative excess
    ranked, d_code = ranked[valid], d_code[valid]
    lo, hi = percentile_interval(ranked)
    interval = [
        None if lo == -np.inf else float(batches[-1]) if lo == np.inf else lo,
        None if hi == np.inf else float(batches[1]) if hi == -np.inf else hi,
    ]
    shares = {name: float(np.mean(d_code == c)) for name, c in ((RESOLVED, 0), (ABOVE, 1), (BELOW, -1))}
    return interval, shares


def _draw_means(values: np.ndarray, errors: np.ndarray, draws: int, gen: np.random.Generator) -> np.ndarray:
    """`draws` draws of the mean loss of one batch's seeds (the rule: critical_batch_at)."""
    n = len(values)
    if not np.all(np.isfinite(values)):  # a diverged seed: the mean is diverged in every draw
        return np.full(draws, np.inf)
    if n == 1:
        return values[0] + errors[0] * gen.standard_normal(draws)
    scale = max(float(np.std(values, ddof=1)), float(np.sqrt(np.mean(errors**2)))) / math.sqrt(n)
    return values.mean() + scale * gen.standard_t(n - 1, draws)


def _finite_or_inf(x: float) -> float:
    x = float(x)
    return x if math.isfinite(x) else math.inf


def critical_batch_along(
    ends: Sequence[BranchEnd],
    tolerance: Union[float, Tolerance] = DEFAULT_TOLERANCE,
    draws: int = DEFAULT_DRAWS,
    rng: Union[None, int, np.random.Generator] = None,
) -> List[Dict[str, Any]]:
    """`critical_batch_at` for every branch point among `ends`, sorted by tokens (the report's
    `branch_cbs`). One generator runs through the points in that order, so the result does not
    depend on the order of `ends`."""
    by_point: Dict[int, List[BranchEnd]] = defaultdict(list)
    for e in ends:
        by_point[int(e.at_tokens)].append(e)
    gen = _generator(rng)
    return [critical_batch_at(by_point[t], tolerance, draws, gen) for t in sorted(by_point)]
