"""A known-truth world for batch-size schedules: a run whose critical batch size along training is
known exactly, on which any schedule's optimizer steps and final loss at equal tokens follow in
closed form, beside the oracle that tracks the critical batch size and the best fixed batch.

McCandlish et al.'s (2018) model of progress per optimizer step at the best learning rate of every
step (tests/known_truth.py integrates the same model with an lr schedule, noise and seeds; this
world leaves those out so that a schedule's cost is exact): an update at batch B (tokens) at loss
L makes the progress of an infinitely large batch times 1 / (1 + B_noise(L) / B), with

    dL / dS_min = -rate (L - floor)^exponent                             (S_min: steps at B -> inf)
    B_noise(L)  = b_noise ((loss_start - floor) / (L - floor))^rise     (rising as the loss falls)

so a step at B costs dS = dS_min (1 + B_noise / B) and B dS tokens. With x = L - floor, p the
exponent, r the rise and c = b_noise (loss_start - floor)^r, both limits integrate in closed form:

    S_min(x) = x^(1 - p) / ((p - 1) rate)                 the fewest steps, from x0 to x: S_min(x) - S_min(x0)
    E_min(x) = c x^(1 - p - r) / ((p + r - 1) rate)       the fewest tokens

and at a fixed batch B the steps between two losses are exactly S_min + E_min / B: McCandlish's
hyperbola, whose B_crit = E_min / S_min is B_noise averaged over the path weighted by dS_min. The
critical batch size at a point of training is B_noise(L) there: at B = B_noise(L) a step costs
twice the fewest steps and twice the fewest tokens. The oracle trains at that batch at every
moment (B_crit(t) = B_noise(L(t)) along its own run): to every loss it takes exactly 2 S_min
steps and 2 E_min tokens.

A schedule is what `batch.ramp` takes: [(from_tokens, tokens_per_update), ...] from 0; a segment
of T tokens at B is T / B steps (whole updates or not: the world is continuous). `regret` runs one
to the world's budget and compares it with the oracle and with the best fixed batch (the batch
size of `batches` with the lowest final loss at equal tokens: in this model always the smallest,
since a token buys the most progress at the smallest batch). Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from orchestrator.analysis.branch_cbs import BranchEnd

Schedule = Sequence[Tuple[float, float]]
"""[(from_tokens, tokens_per_update), ...], the first from 0 (batch.ramp's form)."""

BATCHES = tuple(2.0**k for k in range(7, 15))  # 128 .. 16,384 tokens


@dataclass(frozen=True)
class Outcome:
    """Where a schedule is after its tokens."""

    tokens: float
    steps: float
    loss: float


@dataclass(frozen=True)
class ScheduleWorld:
    loss_start: float = 5.5
    floor: float = 2.0
    rate: float = 2.5e-3
    exponent: float = 1.5
    b_noise: float = 256.0
    """Tokens, at loss_start."""
    rise: float = 1.0
    """B_noise grows as (L - floor)^-rise: 1 takes it from 256 to 1,792 tokens by loss 2.5."""
    total_tokens: float = 2.0**22

    def __post_init__(self):
        if not (self.exponent > 1 and self.rise >= 0 and self.loss_start > self.floor):
            raise ValueError("need exponent > 1, rise >= 0 and loss_start > floor (closed forms below)")

    @property
    def _c(self) -> float:
        return self.b_noise * (self.loss_start - self.floor) ** self.rise

    def b_crit(self, loss: float) -> float:
        """The critical batch size at `loss`: B_noise there (tokens)."""
        return self._c * (loss - self.floor) ** -self.rise

    def s_min(self, loss: float) -> float:
        """The fewest steps from loss_start to `loss` (an infinitely large batch)."""
        p, x0, x = self.exponent, self.loss_start - self.floor, loss - self.floor
        return (x ** (1 - p) - x0 ** (1 - p)) / ((p - 1) * self.rate)

    def e_min(self, loss: float) -> float:
        """The fewest tokens from loss_start to `loss` (an infinitely small batch)."""
        q, x0, x = self.exponent + self.rise, self.loss_start - self.floor, loss - self.floor
        return self._c * (x ** (1 - q) - x0 ** (1 - q)) / ((q - 1) * self.rate)

    def steps_at(self, batch: float, start: float, loss: float) -> float:
        """Steps at a fixed batch from loss `start` down to `loss`: S_min + E_min / B between them."""
        return self.s_min(loss) - self.s_min(start) + (self.e_min(loss) - self.e_min(start)) / batch

    def loss_after(self, batch: float, start: float, steps: float) -> float:
        """The loss after `steps` steps at a fixed batch from loss `start` (steps_at inverted, by
        bisection in log (L - floor): to float precision)."""
        low, high = math.log(1e-12), math.log(start - self.floor)  # in log x: steps_at falls as x rises
        for _ in range(100):
            mid = 0.5 * (low + high)
            if self.steps_at(batch, start, self.floor + math.exp(mid)) > steps:
                low = mid
            else:
                high = mid
        return self.floor + math.exp(0.5 * (low + high))

    def run(self, schedule: Schedule, tokens: Optional[float] = None) -> Outcome:
        """The schedule's steps and loss after `tokens` (default the budget; past the schedule's
        last change it keeps its last batch)."""
        tokens = self.total_tokens if tokens is None else tokens
        loss, steps = self.loss_start, 0.0
        for (start, batch), end in _segments(schedule, tokens):
            loss = self.loss_after(batch, loss, (end - start) / batch)
            steps += (end - start) / batch
        return Outcome(tokens, steps, loss)

    def steps_to(self, schedule: Schedule, loss: float) -> float:
        """Steps the schedule takes to reach `loss` (past the budget, at its last batch, if it must)."""
        now, steps = self.loss_start, 0.0
        for (start, batch), end in _segments(schedule, math.inf):
            needed = self.steps_at(batch, now, loss)
            if needed <= (end - start) / batch:
                return steps + needed
            now, steps = self.loss_after(batch, now, (end - start) / batch), steps + (end - start) / batch
        raise AssertionError("the last segment is endless")

    def oracle(self, tokens: Optional[float] = None) -> Outcome:
        """B = B_crit(L) at every moment: 2 E_min tokens and 2 S_min steps to every loss, so the
        loss after `tokens` inverts 2 E_min in closed form."""
        tokens = self.total_tokens if tokens is None else tokens
        q, x0 = self.exponent + self.rise, self.loss_start - self.floor
        x = (x0 ** (1 - q) + tokens / 2 * (q - 1) * self.rate / self._c) ** (1 / (1 - q))
        return Outcome(tokens, 2 * self.s_min(self.floor + x), self.floor + x)

    def oracle_schedule(self, changes: int = 64) -> List[Tuple[float, float]]:
        """The oracle as a batch.ramp: `changes` stretches of the budget, equal in log tokens from
        one oracle step on, each at B_crit where the oracle is when it starts (so a finer one is
        closer to the oracle; it lags as any ramp read from the run does)."""
        first = self.b_crit(self.loss_start)
        starts = [0.0] + [first * (self.total_tokens / first) ** (k / changes) for k in range(changes)]
        return [(t, self.b_crit(self.oracle(t).loss)) for t in starts]

    def best_fixed(self, batches: Sequence[float] = BATCHES) -> float:
        """The batch of `batches` with the lowest loss at the budget."""
        return min(batches, key=lambda b: self.run([(0.0, b)]).loss)


def _segments(schedule: Schedule, until: float):
    """((from_tokens, batch), to_tokens) of each stretch of the schedule before `until`."""
    steps = sorted((float(t), float(b)) for t, b in schedule)
    if not steps or steps[0][0] != 0 or any(b <= 0 for _, b in steps):
        raise ValueError(f"a schedule starts at 0 tokens with positive batch sizes, got {list(schedule)}")
    ends = [t for t, _ in steps[1:]] + [math.inf]
    return [((t, b), min(end, until)) for (t, b), end in zip(steps, ends) if t < until]


@dataclass(frozen=True)
class Regret:
    """A schedule against the oracle and the best fixed batch, at the world's budget."""

    outcome: Outcome
    oracle: Outcome
    best_fixed_batch: float
    best_fixed: Outcome
    extra_steps_vs_oracle: float
    """Steps the schedule takes to the oracle's final loss, minus the oracle's (negative: fewer)."""
    extra_loss_vs_oracle: float
    """The schedule's loss at the budget minus the oracle's."""
    extra_steps_vs_best_fixed: float
    """Steps the schedule takes to the best fixed batch's final loss, minus that batch's."""
    extra_loss_vs_best_fixed: float


def regret(schedule: Schedule, world: ScheduleWorld = ScheduleWorld(), batches: Sequence[float] = BATCHES) -> Regret:
    """What a schedule costs against the oracle and against the best fixed batch of `batches`:
    extra steps at equal loss and extra loss at equal tokens (the budget)."""
    outcome, oracle = world.run(schedule), world.oracle()
    best = world.best_fixed(batches)
    fixed = world.run([(0.0, best)])
    return Regret(
        outcome=outcome,
        oracle=oracle,
        best_fixed_batch=best,
        best_fixed=fixed,
        extra_steps_vs_oracle=world.steps_to(schedule, oracle.loss) - oracle.steps,
        extra_loss_vs_oracle=outcome.loss - oracle.loss,
        extra_steps_vs_best_fixed=world.steps_to(schedule, fixed.loss) - fixed.steps,
        extra_loss_vs_best_fixed=outcome.loss - fixed.loss,
    )


# ---------------------------------------------------------------- a branch study of the world

STUDY_SHARES = (16384 / 262144, 65536 / 262144, 180224 / 262144)
"""conf/sweep/branches.yaml's branch points as shares of its budget."""
STUDY_FACTORS = (1, 2, 4, 8, 16)
STUDY_BRANCH_SHARE = 81920 / 262144
"""Its branches' length as a share of its budget."""
FIXED_SEED_SPREAD = 0.016 / 2.470
"""The fixed arm's seed spread in ramp_vs_fixed (docs/benchmarks.md) as a share of its final loss:
the deterministic world has no seeds, so "within the seed spread" is within this share of the
best fixed batch's loss."""


def branch_ends(world: ScheduleWorld, base_batch: float) -> List[BranchEnd]:
    """The branch study of conf/sweep/branches.yaml laid on the world: a base run at `base_batch`
    to each branch point, from there a branch at every factor for the same tokens, each ending at
    the world's exact loss (no eval noise: the branched critical batch size then differs from
    B_crit(t) only by what the tolerance rule is)."""
    length = STUDY_BRANCH_SHARE * world.total_tokens
    ends = []
    for share in STUDY_SHARES:
        at = int(share * world.total_tokens) // int(base_batch) * int(base_batch)  # whole base updates
        start = world.run([(0.0, base_batch)], at).loss
        for k in STUDY_FACTORS:
            batch = k * base_batch
            ends.append(BranchEnd(at, int(batch), world.loss_after(batch, start, length / batch)))
    return ends


def online_schedule(
    world: ScheduleWorld, base: float, threshold: float, every: float = 1024.0
) -> List[Tuple[float, float]]:
    """batch.schedule=adaptive on the world with a perfect noise scale (B_crit where the run is)
    read every `every` tokens: double when it passes `threshold` x the batch, i.e. the rule's 2x
    with calibration 2 / threshold. No measurement noise and no patience: the rule's best case."""
    schedule, batch, tokens = [(0.0, base)], base, 0.0
    while tokens < world.total_tokens:
        if world.b_crit(world.run(schedule, tokens).loss) >= threshold * batch:
            batch *= 2
            schedule.append((tokens, batch))
        tokens += every
    return schedule
