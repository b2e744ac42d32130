"""The critical batch size measured by branching from checkpoints (pure: numpy and scipy).

Merrill et al. 2025 ("Critical Batch Size Revisited") measure the critical batch size *at a point
of training* instead of as an average over a from-scratch sweep: from a checkpoint of a base run
at t tokens (base batch B0 tokens per update) short continuations ("branches") are trained at
k x B0 for a few factors k, the learning rate scaled by k^alpha, each for the same number of
tokens; the critical batch size at t is the largest branch batch whose loss at the end of the
branch is within a relative tolerance of the factor-1 branch. A batch at or below it makes
(almost) the same progress per token as the base batch, so it takes fewer steps for free.

This module is the arithmetic of that measurement, what the report shows of it and the batch
ramp it suggests: the crossing of the tolerance at one branch point (`critical_batch_at`) with a
parametric bootstrap interval, the same along the branch points (`critical_batch_along`), a
power law in tokens fitted to the resolved points (`power_law_fit`), and a doubling ramp that
follows it (`suggested_ramp`, `ramp_yaml`, `ramp_override`). No Ray, MLflow or DeepSpeed here:
callers read the branch ends from wherever the runs logged them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from scipy import stats

from orchestrator.critical_batch import INTERVAL_LEVEL, percentile_interval

DEFAULT_TOLERANCE = 0.01
"""1 % relative excess loss over the factor-1 branch: Merrill et al.'s order of magnitude, and
(with the eval set sized to make the tolerance at least three standard errors) large enough that
eval noise alone rarely crosses it. A stated choice, not a law: the report names it."""

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


def _crossings(log_batches: np.ndarray, excess: np.ndarray, tolerance: float) -> Tuple[np.ndarray, np.ndarray]:
    """The rule, per row of `excess` [..., K] (relative excess over the smallest batch, so
    column 0 is 0): walk up from the smallest batch while the excess is within tolerance; the
    first batch beyond it is the crossing, and the critical batch is where the straight line in
    log B between the last batch within and the first beyond reaches the tolerance. Batches past
    the first beyond are not read, even if noise brings one back within: the rule takes the
    first crossing from below after the run of within-tolerance batches from the smallest.
    Returns (code, log cbs): code 0 resolved, 1 above (no batch beyond), -1 below (the second
    smallest already beyond); log cbs is NaN unless resolved."""
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
    return code, np.where(code == 0, log_cbs, np.nan)


def _not_resolved(tokens: int, reason: str, tolerance: float, **rest: Any) -> Dict[str, Any]:
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
        "tolerance": tolerance,
        "b_simple": None,
        "resolved_share": None,
        "draw_shares": None,
        "interval_from": None,
        "interval_level": INTERVAL_LEVEL,
    }
    out.update(rest)
    return out


def eval_tokens_needed(ends: Sequence[BranchEnd], tolerance: float, eval_tokens: int) -> Optional[int]:
    """The eval set that makes `tolerance` SE_PER_TOLERANCE standard errors of the branches'
    median relative eval standard error, which falls as 1 / sqrt(eval tokens); None when the
    eval set is large enough already or no branch has a standard error."""
    relative = [e.loss_se / e.loss for e in ends if e.loss_se > 0 and math.isfinite(e.loss) and e.loss > 0]
    if not relative:
        return None
    needed = eval_tokens * (SE_PER_TOLERANCE * float(np.median(relative)) / tolerance) ** 2
    return math.ceil(needed) if needed > eval_tokens else None


def _generator(rng: Union[None, int, np.random.Generator]) -> np.random.Generator:
    """A fixed seed by default, so that the same runs give the same report."""
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(0 if rng is None else rng)


def critical_batch_at(
    ends: Sequence[BranchEnd],
    tolerance: float = DEFAULT_TOLERANCE,
    draws: int = DEFAULT_DRAWS,
    rng: Union[None, int, np.random.Generator] = None,
) -> Dict[str, Any]:
    """The critical batch size at ONE branch point, from its branches' end losses.

    The reference is the smallest batch (factor 1); each batch's loss is its mean over seeds,
    and its relative excess is (L_k - L_1) / L_1. The critical batch is where the excess crosses
    `tolerance`, interpolated linearly in log B between the last batch within tolerance and the
    first beyond it, walking up from the smallest batch (so the first crossing from below after
    the run of within-tolerance batches from the smallest: the excess should rise with B, and a
    noisy dip back within tolerance at a larger batch is not read). A diverged branch (NaN or
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
    each draw redraws every batch's mean loss, recomputes the crossing by the same rule, and the
    interval is the 5th and 95th percentiles of the draws. One seed: the loss is drawn from
    N(loss, loss_se). Several seeds: the mean is drawn from mean + s / sqrt(n) x T(n - 1), s the
    seeds' standard deviation (or the eval noise, the root mean square of their loss_se, when
    that is larger: the seeds' spread already contains the eval noise, so the two are not added)
    and T(n - 1) Student's t, what the mean of n normal seeds is known to within given their own
    spread. Resampling the seeds instead covers badly with the few seeds branches have (the
    spread of a resample of n is sqrt((n - 1) / n) of the mean's, and the spread itself is
    estimated from n points): with four seeds its 90 % interval covered 77 % of the tests'
    experiments, this one 93 to 96 % (two seeds: the t has one degree of freedom, and the
    interval is mostly unbounded, which is what two seeds can tell). An `above` draw ranks above
    every resolved one and a `below` draw under every one, and an end of the interval that falls
    on such a draw is a bound, not a number: a lower end among `below` draws is None (no lower
    bound), a lower end among `above` draws is the largest batch; an upper end among `above`
    draws is None (no upper bound), an upper end among `below` draws is the second smallest
    batch. So an `above` point whose draws are all above reads [largest batch, None], a `below`
    one [None, factor-2 batch].
    `draw_shares` gives the share of draws per status (`resolved_share` that of resolved ones).
    The draws treat the losses as independent: branches scored on one shared eval set have
    positively correlated eval errors, so the excess is less noisy than this assumes and the
    interval is conservative. Without any noise to draw (every loss_se 0 and one seed per batch)
    there is no interval: None, not a zero-width one. A diverged seed makes its batch's mean
    diverged in every draw.

    `rng`: a Generator, a seed, or None for seed 0 (the same runs give the same report).
    """
    if not ends:
        raise ValueError("critical_batch_at needs the branches of one branch point, got none")
    points = {int(e.at_tokens) for e in ends}
    if len(points) != 1:
        raise ValueError(f"critical_batch_at takes one branch point, got branches at {sorted(points)} tokens")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance is a relative excess loss in (0, 1), got {tolerance}")
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
        return _not_resolved(tokens, "one batch size: nothing to compare with the reference", tolerance, **common)
    reference = float(means[0])
    if not (math.isfinite(reference) and reference > 0):
        return _not_resolved(tokens, f"the reference (factor-1) loss is {reference}", tolerance, **common)
    excess = (means - reference) / reference
    log_b = np.log(np.asarray(batches, np.float64))
    code, log_cbs = _crossings(log_b, excess[None, :], tolerance)
    status = {0: RESOLVED, 1: ABOVE, -1: BELOW}[int(code[0])]
    cbs = {RESOLVED: float(np.exp(log_cbs[0])), ABOVE: float(batches[-1]), BELOW: float(batches[1])}[status]

    noisy = any(s.any() for s in se)
    replicated = any(n > 1 for n in seeds)
    interval: Optional[List[Optional[float]]] = None
    shares: Optional[Dict[str, float]] = None
    source = " and ".join(w for w, on in (("eval noise", noisy), ("seeds", replicated)) if on) or None
    if source and draws > 0:
        gen = _generator(rng)
        drawn = np.stack([_draw_means(v, e, draws, gen) for v, e in zip(loss, se)], 1)
        ref = drawn[:, :1]
        with np.errstate(invalid="ignore"):
            d_code, d_log = _crossings(log_b, (drawn - ref) / ref, tolerance)
        ranked = np.where(d_code == 1, np.inf, np.where(d_code == -1, -np.inf, np.exp(d_log)))
        valid = ref[:, 0] > 0  # a drawn reference loss <= 0 (a far tail of few seeds) has no relative excess
        ranked, d_code = ranked[valid], d_code[valid]
        lo, hi = percentile_interval(ranked)
        interval = [
            None if lo == -np.inf else float(batches[-1]) if lo == np.inf else lo,
            None if hi == np.inf else float(batches[1]) if hi == -np.inf else hi,
        ]
        shares = {name: float(np.mean(d_code == c)) for name, c in ((RESOLVED, 0), (ABOVE, 1), (BELOW, -1))}
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
        "tolerance": tolerance,
        "b_simple": b_simple,
        "resolved_share": None if shares is None else shares[RESOLVED],
        "draw_shares": shares,
        "interval_from": source if interval is not None else None,
        "interval_level": INTERVAL_LEVEL,
    }


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
    tolerance: float = DEFAULT_TOLERANCE,
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


# ---------------------------------------------------------------- the power law along training


PointLike = Union[Mapping[str, Any], Tuple[float, float]]


def _resolved_points(points: Sequence[PointLike]) -> List[Tuple[float, float]]:
    out = []
    for p in points:
        if isinstance(p, Mapping):
            if p.get("status") != RESOLVED:
                continue
            t, c = p["tokens"], p["cbs"]
        else:
            t, c = p
        if t is not None and c is not None and t > 0 and c > 0 and math.isfinite(t) and math.isfinite(c):
            out.append((float(t), float(c)))
    return out


def power_law_fit(points: Sequence[PointLike], t_ref: Optional[float] = None) -> Optional[Dict[str, Any]]:
    """cbs = coef x (tokens / t_ref)^exponent fitted to the resolved points by least squares in
    log-log (the critical batch size grows roughly as a power of the data seen: about the square
    root in Merrill et al. and Zhang et al. 2024, so a straight line in log-log is the natural
    summary, and log errors treat a factor 2 the same at every scale).

    `points`: entries of `critical_batch_along` (only `resolved` ones are used: a bound is not a
    value) or (tokens, cbs) pairs (taken as resolved). `t_ref` defaults to the geometric mean
    of the fitted tokens, where the fit's coefficient and exponent are uncorrelated, so `coef` is
    the fitted critical batch at the middle of the measured range.

    `exponent_interval` is the 90 % interval from the t-distribution with n - 2 degrees of
    freedom on the residuals of the line (exponent +- t_0.95 x its standard error): a small
    number of points with independent errors, and no resampling to go wrong with three of them.
    It is None with exactly two points (the line goes through both: no residual to judge it by).
    The whole fit is None with fewer than two resolved points or all at the same tokens."""
    pts = _resolved_points(points)
    if len(pts) < 2:
        return None
    t = np.array([p[0] for p in pts])
    c = np.array([p[1] for p in pts])
    if t_ref is None:
        t_ref = float(np.exp(np.mean(np.log(t))))
    x = np.log(t / t_ref)
    y = np.log(c)
    xc = x - x.mean()
    sxx = float((xc**2).sum())
    if sxx <= 0:
        return None
    slope = float((xc * (y - y.mean())).sum() / sxx)
    intercept = float(y.mean() - slope * x.mean())
    n = len(pts)
    dof = n - 2
    interval = None
    residual_sd = None
    if dof > 0:
        resid = y - (intercept + slope * x)
        residual_sd = float(math.sqrt((resid**2).sum() / dof))
        half = float(stats.t.ppf(0.5 + INTERVAL_LEVEL / 2, dof)) * residual_sd / math.sqrt(sxx)
        interval = [slope - half, slope + half]
    return {
        "coef": float(math.exp(intercept)),
        "exponent": slope,
        "exponent_interval": interval,
        "t_ref": float(t_ref),
        "points": n,
        "residual_sd": residual_sd,
        "interval": f"t-distribution, {dof} dof" if interval else None,
    }


def fit_value(fit: Mapping[str, Any], tokens: float) -> float:
    """The fitted critical batch size at `tokens`."""
    if tokens <= 0:
        return 0.0 if fit["exponent"] > 0 else math.inf
    return float(fit["coef"] * (tokens / fit["t_ref"]) ** fit["exponent"])


def fit_tokens_at(fit: Mapping[str, Any], cbs: float) -> Optional[float]:
    """Tokens at which a rising fit reaches `cbs` (None unless the exponent is positive)."""
    if fit["exponent"] <= 0:
        return None
    return float(fit["t_ref"] * (cbs / fit["coef"]) ** (1.0 / fit["exponent"]))


# ---------------------------------------------------------------- a batch ramp that follows it


def _points_curve(along: Sequence[Mapping[str, Any]]) -> Callable[[float, float], Optional[float]]:
    """first(level, after) on the measured points, read conservatively (the ramp should not
    outrun the measurement): a resolved point counts at its value, an `above` one at its lower
    bound (the largest batch tried), a `below` one at its smallest batch (the base batch: the
    critical batch is under factor 2, so no reason to grow there), a `not resolved` one not at
    all. Between points the curve is linear in log-log; before the first point it is unknown, so
    zero (no doubling); after the last it holds the last value (no extrapolation: Merrill et al.
    see the critical batch size plateau)."""
    knots = []
    for p in along:
        t, status = p.get("tokens"), p.get("status")
        if t is None or t <= 0:  # not on a log axis
            continue
        if status in (RESOLVED, ABOVE) and p.get("cbs"):
            knots.append((float(t), float(p["cbs"])))
        elif status == BELOW and p.get("batches"):
            knots.append((float(t), float(p["batches"][0])))
    knots.sort()
    lt = np.log([k[0] for k in knots]) if knots else np.array([])
    lc = np.log([k[1] for k in knots]) if knots else np.array([])

    def first(level: float, after: float) -> Optional[float]:
        if not knots:
            return None
        ll = math.log(level)
        for i in range(len(knots)):
            left = max(after, knots[i][0])
            last = i == len(knots) - 1
            if not last and left >= knots[i + 1][0]:
                continue
            if last:
                return left if lc[i] >= ll else None
            # the log-log line over [t_i, t_i+1] is monotone: if it reaches the level, past `left`
            at_left = lc[i] + (math.log(left) - lt[i]) * (lc[i + 1] - lc[i]) / (lt[i + 1] - lt[i])
            if at_left >= ll:
                return left
            if lc[i + 1] >= ll:
                return float(math.exp(lt[i] + (ll - lc[i]) / (lc[i + 1] - lc[i]) * (lt[i + 1] - lt[i])))
        return None

    return first


def _fit_curve(fit: Mapping[str, Any]) -> Callable[[float, float], Optional[float]]:
    def first(level: float, after: float) -> Optional[float]:
        t = fit_tokens_at(fit, level)
        return None if t is None else max(t, after)

    return first


def suggested_ramp(
    along: Sequence[Mapping[str, Any]],
    fit: Optional[Mapping[str, Any]],
    base_batch: int,
    total_tokens: int,
    seq_len: int,
    num_workers: int,
) -> List[Dict[str, int]]:
    """A batch ramp for `batch.ramp`: start at the base batch and double it whenever the
    measured critical batch size passes twice the current batch (Merrill et al.'s batch-size
    warmup), so the batch stays between half the critical batch size and it once it has grown
    past the base: each doubling is then (almost) free in loss per token and halves the steps.

    The critical batch size followed is the power-law fit where there is one with a positive
    exponent (over the whole budget: past the last branch point it extrapolates the law), else
    the measured points interpolated in log-log and read conservatively (see _points_curve).

    Each step is {"from_tokens": T, "tokens_per_update": B}, the first {0, base_batch}. A change
    due at tokens t* (the curve reaches twice the current batch there) is placed at t* rounded
    down to whole updates of the previous batch counted from its own start (so each segment is
    whole updates, as batch.ramp requires: T_new <= t* < T_new + B_prev), but at least one update
    after the previous change (when the curve passes several doublings within one update, they
    come one update apart). Every B is base_batch x a power of 2, so a multiple of seq_len x
    num_workers whenever base_batch is (checked: ValueError otherwise). No change is placed
    where the new batch would not fit one whole update before `total_tokens`."""
    unit = seq_len * num_workers
    if seq_len <= 0 or num_workers <= 0:
        raise ValueError(f"seq_len and num_workers are positive, got {seq_len} and {num_workers}")
    if base_batch <= 0 or base_batch % unit:
        raise ValueError(
            f"base_batch {base_batch:,} must be a positive multiple of seq_len x num_workers = {unit:,}: "
            "every update splits into whole sequences on every worker"
        )
    if total_tokens < base_batch:
        raise ValueError(f"total_tokens {total_tokens:,} is less than one update of the base batch {base_batch:,}")
    use_fit = fit is not None and fit.get("exponent") is not None and fit["exponent"] > 0
    first = _fit_curve(fit) if use_fit else _points_curve(along)  # type: ignore[arg-type]
    steps = [{"from_tokens": 0, "tokens_per_update": int(base_batch)}]
    start, batch = 0, int(base_batch)
    while True:
        due = first(2.0 * batch, float(start))
        if due is None or due >= total_tokens:
            break
        at = start + max(1, int((due - start) // batch)) * batch
        if at + 2 * batch > total_tokens:
            break
        start, batch = at, 2 * batch
        steps.append({"from_tokens": int(start), "tokens_per_update": int(batch)})
    return steps


def _flow(step: Mapping[str, Any]) -> str:
    return f"{{from_tokens: {int(step['from_tokens'])}, tokens_per_update: {int(step['tokens_per_update'])}}}"


def ramp_yaml(steps: Sequence[Mapping[str, Any]], lr_scaling: Union[None, str, float] = None) -> str:
    """The ramp as a YAML snippet to paste into a train config:

        batch:
          ramp:
            - {from_tokens: 0, tokens_per_update: 8192}
            - {from_tokens: 1048576, tokens_per_update: 16384}

    With `lr_scaling` (sqrt, linear, an exponent; the branch study's own, so the ramp's lr
    follows what the branches measured) it adds `ramp_lr_scaling`."""
    lines = ["batch:", "  ramp:"] + [f"    - {_flow(s)}" for s in steps]
    if lr_scaling is not None:
        lines.append(f"  ramp_lr_scaling: {lr_scaling}")
    return "\n".join(lines) + "\n"


def ramp_override(steps: Sequence[Mapping[str, Any]]) -> str:
    """The ramp as one command-line override, `orchestrator train CONFIG '<this>'` (quoted: it
    holds spaces): batch.ramp=[{from_tokens: 0, tokens_per_update: 8192}, ...]."""
    return "batch.ramp=[" + ", ".join(_flow(s) for s in steps) + "]"
