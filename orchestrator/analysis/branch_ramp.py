"""The branched critical batch size along training (orchestrator/analysis/branch_cbs.py measures it per
branch point): a power law in tokens fitted to the resolved points (`power_law_fit`) and a batch
ramp that doubles where the critical batch size passes THRESHOLD x the batch (`suggested_ramp`),
as a YAML snippet (`ramp_yaml`) and as an override (`ramp_override`). Pure: numpy and scipy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from scipy import stats

from orchestrator.analysis.branch_cbs import ABOVE, BELOW, RESOLVED
from orchestrator.analysis.critical_batch import INTERVAL_LEVEL
from orchestrator.formulas import adaptive_batch, batching

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
        "growth": growth(slope, interval),
    }


RISING, PLATEAU, FALLING, UNRESOLVED = "rising", "plateau", "falling", "not resolved"


def growth(exponent: float, interval: Optional[Sequence[float]]) -> str:
    """What the power law says of the critical batch size along training: `rising` when the
    exponent's interval lies above 0, `falling` when below, `plateau` when it holds 0 (Merrill et
    al. 2025 see it level off), `not resolved` with two points (no interval: no growth is claimed)."""
    if interval is None:
        return UNRESOLVED
    low, high = interval
    return RISING if low > 0 else FALLING if high < 0 else PLATEAU


def fit_value(fit: Mapping[str, Any], tokens: float) -> float:
    """The fitted critical batch size at `tokens`."""
    if tokens <= 0:
        return 0.0 if fit["exponent"] > 0 else math.inf
    return float(fit["coef"] * (tokens / fit["t_ref"]) ** fit["exponent"])


def fit_tokens_at(fit: Mapping[str, Any], cbs: float) -> Optional[float]:
    """Tokens at which a rising fit reaches `cbs`: None unless the exponent is positive, or where
    a nearly flat law would reach it only past any budget (1e30 tokens)."""
    if fit["exponent"] <= 0:
        return None
    log_tokens = math.log(fit["t_ref"]) + (math.log(cbs) - math.log(fit["coef"])) / fit["exponent"]
    return math.exp(log_tokens) if log_tokens < math.log(1e30) else None


# ---------------------------------------------------------------- a batch ramp that follows it

THRESHOLD = 8.0
"""Double the batch when the measured critical batch size reaches this many times it, so the batch
stays between an eighth and a quarter of it: a safety factor of 4 over Merrill et al.'s 2. Chosen on
the schedule world (tests/schedule_truth.py, McCandlish's model with exact B_crit(t), branch tables
laid out as conf/sweep/branches.yaml's): a step at B costs 1 + B / B_crit times the fewest tokens,
so at 2x (B up to B_crit) a ramp pays up to twice the tokens and ended 0.044 above the best fixed
batch's loss (3 x the seed spread of ramp_vs_fixed's fixed arm), at 4x 0.018, at 6x 0.009, at 8x
0.007 in 37 % fewer steps (docs/benchmarks.md, "schedule_ramp_rules"). A resolved point is read
at the lower end of its 90 % interval (`_points_curve`): on that world it changes nothing at 8x,
and on the shipped study, one seed per branch, it keeps the ramp from doubling on a point measured
at 3,334 whose interval reaches down to 1,261, a ramp that lost 1.2 % of the loss for 41 % fewer
steps on real runs (ramp_vs_fixed, 2026-12-07)."""


def _points_curve(along: Sequence[Mapping[str, Any]]) -> Callable[[float, float], Optional[float]]:
    """first(level, after) on the measured points, read conservatively (the ramp should not
    outrun the measurement): a resolved point counts at the lower end of its 90 % interval (at its
    value where it has no interval, or one unbounded below), an `above` one at its lower bound
    (the largest batch tried), a `below` one at its smallest batch (the base batch: the
    critical batch is under factor 2, so no reason to grow there), a `not resolved` one not at
    all. Between points the curve is linear in log-log; before the first point it is unknown, so
    zero (no doubling); after the last it holds the last value (no extrapolation: Merrill et al.
    see the critical batch size plateau)."""
    knots = []
    for p in along:
        t, status = p.get("tokens"), p.get("status")
        if t is None or t <= 0:  # not on a log axis
            continue
        if status == RESOLVED and p.get("cbs"):
            low = (p.get("cbs_interval") or (None, None))[0]
            knots.append((float(t), float(low or p["cbs"])))
        elif status == ABOVE and p.get("cbs"):
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


def _capped_by_fit(
    fit: Mapping[str, Any], points: Callable[[float, float], Optional[float]]
) -> Callable[[float, float], Optional[float]]:
    """first(level, after) on the lower of the rising fit and the measured points: the fit smooths
    the points' noise, the points keep the ramp within what was measured (an `above` point's bound
    is not read as a value past it, nor the law past the last point)."""

    def first(level: float, after: float) -> Optional[float]:
        t = fit_tokens_at(fit, level)
        return None if t is None else points(level, max(t, after))

    return first


def suggested_ramp(
    along: Sequence[Mapping[str, Any]],
    fit: Optional[Mapping[str, Any]],
    base_batch: int,
    total_tokens: int,
    seq_len: int,
    num_workers: int,
    threshold: float = THRESHOLD,
) -> List[Dict[str, int]]:
    """A batch ramp for `batch.ramp`: start at the base batch and double it whenever the
    measured critical batch size passes `threshold` x the current batch (Merrill et al.'s
    batch-size warmup doubles at 2x; the default's safety factor is why THRESHOLD says), so the
    batch stays between 2 / threshold and 1 / threshold of the critical batch size once it has grown
    past the base: each doubling then costs little loss per token and halves the steps.

    The critical batch size followed is the measured points interpolated in log-log and read as
    bounds where they are bounds (see _points_curve: it holds the last point's value after it, so
    the ramp stops growing where the measurement stops); where the power law rises (its exponent's
    interval above 0), the lower of the law and the points, so a noisy point does not make it grow
    early. A plateau or a falling law adds nothing to the points.

    Each step is {"from_tokens": T, "tokens_per_update": B}, the first {0, base_batch}. A change
    due at tokens t* (the curve reaches threshold x the current batch there) is placed at t* rounded
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
    if not threshold >= 2:
        raise ValueError(
            f"the ramp's threshold is at least 2 (a doubled batch stays under the critical one), got {threshold}"
        )
    if total_tokens < base_batch:
        raise ValueError(f"total_tokens {total_tokens:,} is less than one update of the base batch {base_batch:,}")
    points = _points_curve(along)
    rising = fit is not None and fit.get("growth", growth(fit["exponent"], fit.get("exponent_interval"))) == RISING
    first = _capped_by_fit(fit, points) if rising else points  # type: ignore[arg-type]
    steps = [{"from_tokens": 0, "tokens_per_update": int(base_batch)}]
    start, batch = 0, int(base_batch)
    while True:
        due = first(threshold * batch, float(start))
        if due is None or due >= total_tokens:
            break
        at = start + max(1, int((due - start) // batch)) * batch
        if at + 2 * batch > total_tokens:
            break
        start, batch = at, 2 * batch
        steps.append({"from_tokens": int(start), "tokens_per_update": int(batch)})
    return steps


def _pairs(steps: Sequence[Mapping[str, Any]]) -> List[Tuple[int, int]]:
    return [(int(s["from_tokens"]), int(s["tokens_per_update"])) for s in steps]


def ramp_yaml(steps: Sequence[Mapping[str, Any]], lr_scaling: Union[None, str, float] = None) -> str:
    """The ramp as a YAML snippet to paste into a train config:

        batch:
          ramp:
            - {from_tokens: 0, tokens_per_update: 8192}
            - {from_tokens: 1048576, tokens_per_update: 16384}

    With `lr_scaling` (sqrt, linear, an exponent; the branch study's own, so the ramp's lr
    follows what the branches measured) it adds `ramp_lr_scaling`."""
    lines = ["batch:", "  ramp:"] + [f"    - {flow}" for flow in batching.ramp_flow(_pairs(steps))]
    if lr_scaling is not None:
        lines.append(f"  ramp_lr_scaling: {lr_scaling}")
    return "\n".join(lines) + "\n"


def ramp_overrides(steps: Sequence[Mapping[str, Any]], lr_scaling: Union[None, str, float] = None) -> Tuple[str, ...]:
    """Every key ramp_yaml(steps, lr_scaling) sets, as command-line overrides (each one argument):
    without batch.ramp_lr_scaling a pasted ramp would run every change at the base's lr."""
    scaling = () if lr_scaling is None else (f"batch.ramp_lr_scaling={lr_scaling}",)
    return (ramp_override(steps), *scaling)


def ramp_override(steps: Sequence[Mapping[str, Any]]) -> str:
    """The ramp as one command-line override, `orchestrator train CONFIG '<this>'` (quoted: it
    holds spaces): batch.ramp=[{from_tokens: 0, tokens_per_update: 8192}, ...]."""
    return batching.ramp_override(_pairs(steps))


def calibration(points: Sequence[Mapping[str, Any]]) -> Optional[float]:
    """The branched critical batch size over B_simple, the median over the resolved points that
    have both (a bound is not a value, and the median keeps one odd point from setting it); None
    without such a point."""
    ratios = [float(p["cbs"]) / float(p["b_simple"]) for p in _calibrating(points)]
    return float(np.median(ratios)) if ratios else None


def _calibrating(points: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    return [
        p for p in points if p.get("status") == RESOLVED and p.get("cbs") and p.get("b_simple") and p["b_simple"] > 0
    ]


ONLINE_FACTOR = adaptive_batch.THRESHOLD / THRESHOLD
"""What online_calibration multiplies the study's ratio by (2 / 8): the online rule doubles where
its calibrated B_simple passes adaptive_batch.THRESHOLD x the batch, so this makes it double where
the critical batch size passes THRESHOLD x the batch, as the suggested ramp does."""

CALIBRATION_MARGIN = THRESHOLD / 4
"""How far above the ratio at any point the calibration may lie and be resolved (2x): after a
doubling the rule holds the batch at most 2 / THRESHOLD = 1/4 of the critical batch size it reads,
so read 2x too high it is still at most half the true one (Merrill et al.'s 2x rule at its limit);
read too low, the run only grows later than it could."""


@dataclass(frozen=True)
class OnlineCalibration:
    """`batch.calibration_from`'s answer: the setting, the interval it is read from, and whether
    it is resolved (an adaptive run is not started on one that is not)."""

    value: float
    """calibration(points) x ONLINE_FACTOR: the setting that held the fixed batch's loss on real
    runs (ramp_vs_fixed, docs/branches.md); at the ratio itself the run doubles at 2x, the rule
    that lost loss."""
    interval: Tuple[Optional[float], Optional[float]]
    """The ratios the points allow, x ONLINE_FACTOR: from the lowest low end to the highest high
    end of their 90 % intervals (each point's cbs_interval over its B_simple; None: unbounded).
    One setting serves the whole run, so it must hold at every point."""
    resolved: bool
    """value <= CALIBRATION_MARGIN x interval[0]: the setting exceeds the ratio at no point by more
    than the rule's margin, even at the low end of that point's interval."""

    def why_not(self) -> str:
        """Why it is not resolved, in words ("" when it is)."""
        if self.resolved:
            return ""
        low = self.interval[0]
        if low is None:
            return "a point's interval reaches below its smallest branch batch, so the ratio there is not bounded below"
        return (
            f"{self.value:.3g} is {self.value / low:.1f}x the lowest the points allow ({low:.3g}), more than the "
            f"{CALIBRATION_MARGIN:g}x that keeps the batch under half the critical batch size"
        )


def online_calibration(points: Sequence[Mapping[str, Any]]) -> Optional[OnlineCalibration]:
    """`batch.calibration_from`'s answer from a branch study's points; None without a resolved
    point with B_simple beside it."""
    ratio = calibration(points)
    if ratio is None:
        return None
    lows, highs = [], []
    for p in _calibrating(points):
        low, high = p.get("cbs_interval") or (None, None)
        lows.append(None if low is None else low / p["b_simple"] * ONLINE_FACTOR)
        highs.append(None if high is None else high / p["b_simple"] * ONLINE_FACTOR)
    low = None if None in lows else min(lows)
    high = None if None in highs else max(highs)
    value = ratio * ONLINE_FACTOR
    resolved = low is not None and value <= CALIBRATION_MARGIN * low * (1 + 1e-12)
    return OnlineCalibration(value, (low, high), resolved)
