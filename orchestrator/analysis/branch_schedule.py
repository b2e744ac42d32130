"""Which batch schedule a branch study supports: the suggested ramp (orchestrator/analysis/branch_ramp.py)
against the fixed batches it could be replaced by, each predicted from the branches' own end losses,
and the one to train with. Pure: numpy.

A branch measures a gap: from the base's state at t, l tokens at k x B0 (the lr times k^alpha)
end dL_k(t) above the factor-1 branch. A schedule is predicted as the sum of the gaps of its
stretches: a stretch of lambda tokens at factor k from t costs max(0, dL_k(t)) x max(1, lambda / l),
a bound from above on three assumptions that hold where the loss falls ever slower at a constant lr
(the shipped study's schedule): a gap grows no faster than linearly in the stretch's length (under
McCandlish et al.'s progress model it grows with the loss's slope, which falls; where the loss
settles at a noise floor it settles too), it does not grow once the stretch has ended, and a gain
(a larger batch ending below the base, as a lower noise floor does) is not counted, since gains of
successive stretches need not add. A gap holds Adam's reaction to the change of batch, as every
branch begins with one. Between branch points dL_k is linear in log t, past the last it holds the
last point's, before the first the first's, at factors between two that were branched linear in
log k. A fixed batch larger than the base also trains before the first branch point t1, where
nothing was measured: there it is priced at its worst, no more progress per update than the base
makes (the noise-dominated limit), so it falls t1 (1 - 1/k) base tokens behind, which costs the end
of the run L(T - lost) - L(T) on the base's own curve. The upper end adds 1.645 standard errors
to every gap.

The arms: a fixed batch at each branch factor from the start and the suggested ramp. A fixed batch
that was trained from the start to the budget (`Trained`: the runs of `branch.compare_with`'s sweep)
is measured instead: its final loss over the base's, with the standard error of that difference,
replaces the prediction at its batch, since a branch from a checkpoint cannot see what a whole run
at the larger batch does (on Adam a run at 16x from the start ended 2 % below the base while every
16x branch ended above its factor-1 branch: docs/benchmarks.md, schedule_choice). The best fixed
batch is the fixed arm with the lowest loss, predicted or measured (the base's is its own, a gap of
0). An arm is within the tolerance when its upper end is at most SCHEDULE_TOLERANCE above the best
fixed batch's; the choice is the one of those with the fewest updates, or the best fixed batch when
none is within.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from orchestrator.analysis.answer import ScheduleArm, ScheduleChoice
from orchestrator.analysis.branch_cbs import BranchEnd
from orchestrator.analysis.critical_batch import INTERVAL_LEVEL, monotone

SCHEDULE_TOLERANCE = 0.001
"""How far above the best fixed batch's predicted loss (relative) a schedule may be predicted to end,
at the upper end of its prediction, and be chosen for its fewer updates: 0.1 %, a tenth of the
branches' 1 % tolerance, since a schedule pays its excess at the end of the whole run, not of one
branch."""

Z_UPPER = NormalDist().inv_cdf(0.5 + INTERVAL_LEVEL / 2)
"""1.645: an arm's upper end is the upper end of the project's 90 % interval (one-sided 95 %)."""

Schedule = Sequence[Tuple[int, int]]
"""[(from_tokens, tokens_per_update), ...] from 0: batch.ramp's form."""


@dataclass(frozen=True)
class BranchGaps:
    """At one branch point: how far each factor's branch ended above the factor-1 branch."""

    tokens: int
    length: int
    """The branches' tokens, l."""
    factors: Tuple[float, ...]
    """k, ascending, from 1."""
    gap: Tuple[float, ...]
    """dL_k: the mean end loss at k over the factor-1's, in loss (0 at factor 1; infinite for a
    diverged branch)."""
    gap_se: Tuple[float, ...]
    """Its standard error: the two branches' standard errors of their mean losses, combined."""


def gaps(ends: Sequence[BranchEnd], branch_tokens: Mapping[int, int]) -> List[BranchGaps]:
    """Each branch point's gaps from its branches' end losses: per batch, the mean over seeds and
    the standard error of that mean (the seeds' spread or their eval noise, whichever is larger, as
    branch_cbs._draw_means takes it). Points with one batch size, or a length not in
    `branch_tokens`, are left out."""
    by_point: Dict[int, Dict[int, List[BranchEnd]]] = {}
    for e in ends:
        by_point.setdefault(int(e.at_tokens), {}).setdefault(int(e.batch), []).append(e)
    out = []
    for t in sorted(by_point):
        batches = sorted(by_point[t])
        if len(batches) < 2 or t not in branch_tokens:
            continue
        means, errors = zip(*(_mean_and_se(by_point[t][b]) for b in batches))
        out.append(
            BranchGaps(
                tokens=t,
                length=int(branch_tokens[t]),
                factors=tuple(b / batches[0] for b in batches),
                gap=tuple(m - means[0] for m in means),
                gap_se=tuple(0.0 if i == 0 else math.hypot(s, errors[0]) for i, s in enumerate(errors)),
            )
        )
    return out


def _mean_and_se(group: Sequence[BranchEnd]) -> Tuple[float, float]:
    losses = np.array([e.loss if math.isfinite(e.loss) else math.inf for e in group])
    if not np.all(np.isfinite(losses)):
        return math.inf, 0.0
    noise = float(np.sqrt(np.mean([e.loss_se**2 for e in group])))
    spread = float(np.std(losses, ddof=1)) if len(group) > 1 else 0.0
    return float(losses.mean()), max(noise, spread) / math.sqrt(len(group))


def gap_at(measured: Sequence[BranchGaps], tokens: float, factor: float, z: float = 0.0) -> float:
    """dL_k at `tokens` (plus z standard errors): linear in log t between branch points, the first's
    before it, the last's after it; infinite past the largest factor branched everywhere."""
    if factor == 1:
        return 0.0
    if not measured or factor > min(p.factors[-1] for p in measured) * (1 + 1e-9):
        return math.inf
    at = [_gap_of(p, factor, z) for p in measured]
    if any(math.isinf(g) for g in at):
        return math.inf
    knots = np.log([p.tokens for p in measured])
    return float(np.interp(math.log(max(tokens, 1.0)), knots, at))


def _gap_of(point: BranchGaps, factor: float, z: float) -> float:
    """The gap at one point for any factor within its branches: linear in log k between two."""
    log_k = np.log(point.factors)
    values = np.array(point.gap) + z * np.array(point.gap_se)
    if np.isinf(values).any():  # a diverged branch: every factor from it on is infinite
        first = int(np.argmax(np.isinf(values)))
        if factor >= point.factors[first] * (1 - 1e-9):
            return math.inf
        log_k, values = log_k[:first], values[:first]
    return float(np.interp(math.log(factor), log_k, values))


def predicted_gap(
    measured: Sequence[BranchGaps],
    schedule: Schedule,
    base_batch: int,
    total_tokens: int,
    base_loss: Callable[[float], float],
    z: float = 0.0,
) -> float:
    """The schedule's loss at `total_tokens` over the base fixed batch's, in loss: the sum of its
    stretches' gaps (the module's rule)."""
    first = measured[0].tokens if measured else math.inf
    lost, total = 0.0, 0.0  # base tokens lost before the first branch point; loss from stretches after it
    for (start, batch), end in _stretches(schedule, total_tokens):
        k = batch / base_batch
        if k == 1:
            continue
        if start < first:
            lost += (min(end, first) - start) * (1 - 1 / k)
            start = min(end, first)
            if start >= end:
                continue
        gap = max(0.0, gap_at(measured, start, k, z))
        total += gap * max(1.0, (end - start) / measured[0].length)
    return total + base_loss(total_tokens - lost) - base_loss(total_tokens)


def updates(schedule: Schedule, total_tokens: int) -> int:
    """Optimizer updates the schedule takes over `total_tokens`."""
    return int(sum(math.ceil((end - start) / batch) for (start, batch), end in _stretches(schedule, total_tokens)))


def _stretches(schedule: Schedule, total_tokens: int) -> List[Tuple[Tuple[int, int], int]]:
    steps = sorted((int(t), int(b)) for t, b in schedule)
    ends = [t for t, _ in steps[1:]] + [total_tokens]
    return [(step, min(end, total_tokens)) for step, end in zip(steps, ends) if step[0] < total_tokens]


@dataclass(frozen=True)
class Trained:
    """A fixed batch trained from the start to the budget: its final loss over the base run's, measured."""

    batch: int
    lr: float
    excess: float
    """Final eval loss over the base run's, relative."""
    excess_se: float
    """Its standard error: the two final evaluations', combined."""

    @classmethod
    def of(cls, batch: int, lr: float, loss: float, loss_se: float, base: float, base_se: float) -> "Trained":
        """From the run's final eval loss and the base's, each with its standard error: the ratio's
        excess, its standard error to first order."""
        ratio = loss / base
        return cls(int(batch), lr, ratio - 1, math.hypot(loss_se, ratio * base_se) / base)


@dataclass(frozen=True)
class Arm:
    """One schedule and what the branches predict of it at the budget (or, trained, what it measured)."""

    name: str
    ramp: Tuple[Tuple[int, int], ...]
    """(from_tokens, tokens_per_update) from 0; one pair for a fixed batch."""
    updates: int
    excess: float
    """Predicted final loss over the base fixed batch's, relative (infinite: past what the branches
    measured, or a diverged branch on its way)."""
    excess_high: float
    """The same with every gap at its upper 95 % bound."""
    lr: Optional[float] = None
    """A trained arm's peak lr (the others start at the base's x k^alpha)."""

    @property
    def fixed(self) -> bool:
        return len(self.ramp) == 1

    @property
    def trained(self) -> bool:
        return self.lr is not None


def trained_arm(run: Trained, total_tokens: int) -> Arm:
    """A trained fixed batch as an arm: its measured excess, the upper end Z_UPPER standard errors above."""
    name = f"fixed {run.batch:,} (trained, lr {run.lr:.3g})"
    ramp = ((0, int(run.batch)),)
    return Arm(name, ramp, updates(ramp, total_tokens), run.excess, run.excess + Z_UPPER * run.excess_se, run.lr)


def predict(
    name: str,
    schedule: Schedule,
    measured: Sequence[BranchGaps],
    base_loss: Callable[[float], float],
    base_batch: int,
    total_tokens: int,
) -> Arm:
    """One arm's updates and its predicted excess (and upper end) over the base fixed batch."""
    final = base_loss(total_tokens)

    def excess(z: float) -> float:
        return predicted_gap(measured, schedule, base_batch, total_tokens, base_loss, z) / final

    ramp = tuple((int(t), int(b)) for t, b in schedule)
    return Arm(name, ramp, updates(ramp, total_tokens), excess(0.0), excess(Z_UPPER))


def choose(arms: Sequence[Arm], tolerance: float = SCHEDULE_TOLERANCE) -> Tuple[Arm, Arm]:
    """(the best fixed batch, the arm to train with): the fixed arm with the lowest predicted loss,
    and the arm with the fewest updates whose upper end is within `tolerance` of it (the best fixed
    batch itself when none is)."""
    fixed = [a for a in arms if a.fixed and math.isfinite(a.excess)]
    best = min(fixed, key=lambda a: (a.excess, a.updates))
    within = [a for a in arms if a.excess_high <= best.excess + tolerance]
    return best, min(within, key=lambda a: (a.updates, a.excess), default=best)


def compare(
    measured: Sequence[BranchGaps],
    ramp: Schedule,
    base_loss: Callable[[float], float],
    base_batch: int,
    total_tokens: int,
    base_lr: Optional[float] = None,
    alpha: float = 0.0,
    tolerance: float = SCHEDULE_TOLERANCE,
    trained: Sequence[Trained] = (),
) -> Optional[ScheduleChoice]:
    """Every arm (the fixed batches at the branches' factors, the ramp when it changes at all) with
    its updates and predicted excess, the best fixed batch, the choice and why; `base_lr` and
    `alpha` (the branches' lr x k^alpha) give the chosen schedule's starting lr. `trained`: fixed
    batches trained to the budget, measured in place of the prediction at theirs (the base's own
    arm stays, the reference). None without a measured branch point."""
    if not measured:
        return None
    factors = sorted({k for p in measured for k in p.factors})
    runs = {int(r.batch) for r in trained}
    fixed = [
        (f"fixed {int(k * base_batch):,}", [(0, int(k * base_batch))])
        for k in factors
        if k == 1 or int(k * base_batch) not in runs
    ]
    arms = [predict(name, steps, measured, base_loss, base_batch, total_tokens) for name, steps in fixed]
    arms += [trained_arm(r, total_tokens) for r in sorted(trained, key=lambda r: r.batch)]
    arms = arms[:1] + sorted(arms[1:], key=lambda a: (a.ramp[0][1], a.trained))
    if len(ramp) > 1:
        arms.append(predict("suggested ramp", ramp, measured, base_loss, base_batch, total_tokens))
    best, chosen = choose(arms, tolerance)
    first = chosen.ramp[0][1] / base_batch
    return ScheduleChoice(
        arms=tuple(
            ScheduleArm(a.name, a.ramp, a.updates, _finite(a.excess), _finite(a.excess_high), a.lr, a.trained)
            for a in arms
        ),
        best_fixed=best.name,
        chosen=chosen.name,
        chosen_ramp=chosen.ramp,
        chosen_lr=chosen.lr if chosen.trained else (None if base_lr is None else base_lr * first**alpha),
        tolerance=tolerance,
        why=why(arms, best, chosen, tolerance),
    )


def choice_of(
    ends: Sequence[BranchEnd],
    branch_tokens: Mapping[int, int],
    base_curve: Tuple[Sequence[float], Sequence[float]],
    ramp: Schedule,
    base_batch: int,
    total_tokens: int,
    base_lr: Optional[float] = None,
    alpha: float = 0.0,
    trained: Sequence[Trained] = (),
) -> Optional[ScheduleChoice]:
    """`compare` on a study's measurements: its branches' ends, each point's branch length and the
    base run's train loss (tokens, loss), read through its monotone fit; `trained` as compare's."""
    knots = monotone(*map(np.asarray, base_curve))

    def base_loss(tokens: float) -> float:
        return float(np.interp(tokens, *knots))

    return compare(
        gaps(ends, branch_tokens), ramp, base_loss, base_batch, total_tokens, base_lr, alpha, trained=trained
    )


def _finite(x: float) -> Optional[float]:
    return float(x) if math.isfinite(x) else None


def why(arms: Sequence[Arm], best: Arm, chosen: Arm, tolerance: float) -> str:
    """The choice in one sentence: what it saves, or why nothing with fewer updates was chosen."""
    if chosen is not best:
        return (
            f"{chosen.name} takes {1 - chosen.updates / best.updates:.0%} fewer updates than {best.name}, the best "
            f"fixed batch, and is {'measured' if chosen.trained else 'predicted'} to end within {tolerance:.1%} of "
            "its loss even at the upper end "
            f"({_pct(chosen.excess_high - best.excess)})"
        )
    fewer = [a for a in arms if a.updates < best.updates and math.isfinite(a.excess)]
    if not fewer:
        return f"{best.name} is the best fixed batch and nothing measured takes fewer updates"
    closest = min(fewer, key=lambda a: a.excess_high)
    words = (
        f"nothing with fewer updates is predicted within {tolerance:.1%} of {best.name}'s loss, the best fixed "
        f"batch: the closest, {closest.name}, saves {1 - closest.updates / best.updates:.0%} of the updates at "
        f"{_pct(closest.excess - best.excess)} ({_pct(closest.excess_high - best.excess)} at the upper end)"
    )
    if closest.excess - best.excess <= tolerance:  # only the measurement's noise holds it back
        words += (
            "; within the tolerance on its value: a lower eval standard error (more eval tokens, seeds) may resolve it"
        )
    return words


def _pct(x: float) -> str:
    return f"{x:+.2%}"
