"""Exact batch arithmetic: tokens per update = S x b x D x A.

S = data.seq_len, b = batch.micro_batch_size (sequences per worker per forward/backward),
D = cluster.num_workers, A = batch.grad_accum_steps.

Decomposition rule: the number of sequences per update N = tokens_per_update / S must be a
whole number and split evenly over the D workers. When A is not given, b is the *largest*
micro-batch not above the given maximum that divides the per-worker share N / D exactly, and
A = (N / D) / b: the fewest accumulation steps that fit in memory, but at least enough for
`min_micro_batches` micro-batches in all (D x A) when the update holds that many sequences (the
gradient noise scale needs two: derived.batch_plan asks for them when gns.enabled). When A is
given, b = N / (D A) must be a whole number not above the maximum. Nothing is ever rounded silently: an infeasible
request raises with the nearest feasible tokens_per_update below and above.

Pure Python: no Ray, DeepSpeed or MLflow here.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

from orchestrator.formulas.errors import ConfigError


@dataclass(frozen=True)
class BatchPlan:
    """One exact decomposition of a global batch."""

    seq_len: int
    """S, tokens per packed sequence."""
    micro_batch_size: int
    """b, sequences per worker per forward/backward."""
    num_workers: int
    """D, data-parallel workers."""
    grad_accum_steps: int
    """A, micro-batches each worker accumulates per optimizer update."""

    @property
    def sequences_per_update(self) -> int:
        return self.micro_batch_size * self.num_workers * self.grad_accum_steps

    @property
    def tokens_per_update(self) -> int:
        return self.seq_len * self.sequences_per_update

    @property
    def micro_batches_per_update(self) -> int:
        """D x A: every one of them is a 'small batch' for the gradient noise scale."""
        return self.num_workers * self.grad_accum_steps

    def steps_for_tokens(self, tokens: int) -> int:
        """Whole optimizer updates that fit in `tokens` (rounded down)."""
        return tokens // self.tokens_per_update

    def tokens_for_steps(self, steps: int) -> int:
        return steps * self.tokens_per_update


def _feasible_neighbours(target: int, unit: int, allowed_max: Optional[int]) -> tuple[Optional[int], Optional[int]]:
    """Nearest multiples of `unit` strictly below and above `target` (capped at allowed_max)."""
    below = (target - 1) // unit * unit
    above = (target // unit + 1) * unit
    if allowed_max is not None:
        below = min(below, allowed_max)
        above = above if above <= allowed_max else None
    return (below if below and below > 0 else None), above


MAX_TOKENS_PER_UPDATE = 2**40
"""The largest batch a config may ask for (about 10^12 tokens, 10^4 times today's largest
published batches): past it a batch is a typo or hostile, and its arithmetic would be unbounded."""

MAX_TOTAL_TOKENS = 2**60
"""The largest budget a config may ask for (about 10^18 tokens, 10^4 times today's largest
published runs): past it a budget is a typo or hostile (an ETA of 10^300 days)."""


def largest_divisor_at_most(n: int, bound: int) -> int:
    """The largest divisor of n (>= 1) that is at most bound (>= 1), by trial division: bound
    candidates down from bound when bound is under the square root, else up to the square root
    (a divisor d there pairs with n // d)."""
    if bound >= n:
        return n
    root = math.isqrt(n)
    if bound <= root:
        return next(b for b in range(bound, 0, -1) if n % b == 0)
    best = 1
    for d in range(1, root + 1):
        if n % d == 0:
            if n // d <= bound:  # the first such pair partner is the largest: d ascends, n // d descends
                return n // d
            best = d
    return best


def _suggest(target: int, unit: int, allowed_max: Optional[int] = None) -> str:
    below, above = _feasible_neighbours(target, unit, allowed_max)
    options = [f"{v:,}" for v in (below, above) if v is not None]
    return "nearest feasible batch.tokens_per_update: " + (" or ".join(options) if options else "none")


def solve(
    seq_len: int,
    tokens_per_update: int,
    max_micro_batch_size: Optional[int],
    num_workers: int,
    grad_accum_steps: Optional[int] = None,
    min_micro_batches: int = 1,
) -> BatchPlan:
    """The exact S x b x D x A decomposition, or a ConfigError saying what would be valid.
    max_micro_batch_size None: no memory bound yet (`auto` before it is resolved).
    min_micro_batches: with A derived, split the update into at least this many micro-batches
    (D x A) if it has the sequences for them; a given A is kept as it is."""
    for key, value in (
        ("data.seq_len", seq_len),
        ("batch.tokens_per_update", tokens_per_update),
        ("batch.micro_batch_size", max_micro_batch_size),
        ("cluster.num_workers", num_workers),
    ):
        if value is not None and value < 1:
            raise ConfigError(key, f"got {value}; must be a positive integer")
    if grad_accum_steps is not None and grad_accum_steps < 1:
        raise ConfigError("batch.grad_accum_steps", f"got {grad_accum_steps}; must be a positive integer or omitted")

    sequences_unit = seq_len * num_workers  # one sequence on every worker
    if grad_accum_steps is None:
        if tokens_per_update % sequences_unit:
            raise ConfigError(
                "batch.tokens_per_update",
                f"got {tokens_per_update:,}; not a multiple of data.seq_len x cluster.num_workers = "
                f"{seq_len} x {num_workers} = {sequences_unit:,}; {_suggest(tokens_per_update, sequences_unit)}",
            )
        per_worker = tokens_per_update // sequences_unit
        bound = per_worker if max_micro_batch_size is None else min(max_micro_batch_size, per_worker)
        fewest_steps = -(-min_micro_batches // num_workers)  # A such that D x A >= min_micro_batches
        if per_worker >= fewest_steps:
            bound = min(bound, per_worker // fewest_steps)
        micro = largest_divisor_at_most(per_worker, bound)
        return BatchPlan(seq_len, micro, num_workers, per_worker // micro)

    accum_unit = sequences_unit * grad_accum_steps
    largest = accum_unit * max_micro_batch_size if max_micro_batch_size is not None else tokens_per_update
    if tokens_per_update % accum_unit or tokens_per_update > largest:
        raise ConfigError(
            "batch.tokens_per_update",
            f"got {tokens_per_update:,}; with batch.grad_accum_steps={grad_accum_steps} it must be "
            f"data.seq_len x cluster.num_workers x grad_accum_steps x b = {accum_unit:,} x b with "
            f"b <= batch.micro_batch_size={max_micro_batch_size}; {_suggest(tokens_per_update, accum_unit, largest)}",
        )
    return BatchPlan(seq_len, tokens_per_update // accum_unit, num_workers, grad_accum_steps)


def total_steps(plan: BatchPlan, total_tokens: int) -> int:
    """Optimizer updates in a token budget; whole updates only, at least one."""
    steps = plan.steps_for_tokens(total_tokens)
    if steps < 1:
        raise ConfigError(
            "train.total_tokens",
            f"got {total_tokens:,}; smaller than one update of {plan.tokens_per_update:,} tokens "
            f"(batch.tokens_per_update); use at least {plan.tokens_per_update:,}",
        )
    return steps


# ---------------------------------------------------------------- batch-size ramps

ALPHA_WORDS = {"sqrt": 0.5, "linear": 1.0}
"""lr scaling exponents by name: the sweep file's lr_scaling.alpha and batch.ramp_lr_scaling."""


@dataclass(frozen=True)
class Segment:
    """A stretch of a run at one batch size: whole updates of `plan` from start_tokens (the
    tokens seen before its first update) to end_tokens."""

    start_tokens: int
    end_tokens: int
    plan: BatchPlan
    start_update: int = 0
    """Updates taken before this segment."""
    lr_factor: float = 1.0
    """The peak learning rate's multiplier here: (B / the first B) ** batch.ramp_lr_scaling."""

    @property
    def updates(self) -> int:
        return (self.end_tokens - self.start_tokens) // self.plan.tokens_per_update


def alpha_of(value: Any, key: str) -> float:
    """sqrt, linear or a number (an lr scaling exponent) as a float."""
    alpha = ALPHA_WORDS.get(value, value) if isinstance(value, str) else value
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ConfigError(key, f"got {value!r}; valid: sqrt, linear, a number, or 0 for none")
    return float(alpha)


def segments(
    changes: Sequence[Tuple[int, int]], total_tokens: int, plan_for: Callable[[int], BatchPlan], alpha: float = 0.0
) -> List[Segment]:
    """The run's segments from (from_tokens, tokens_per_update) changes, the first at 0; each
    stretch must be whole updates of its batch size, and the last ends at the budget rounded
    down to whole updates. plan_for(B) is B's decomposition (derived.batch_plan's rule)."""
    if not changes or changes[0][0] != 0:
        got = changes[0][0] if changes else None
        raise ConfigError("batch.ramp.0.from_tokens", f"got {got}; the first step is at 0")
    plans = []
    for i, (_, tokens) in enumerate(changes):
        try:
            plans.append(plan_for(tokens))
        except ConfigError as error:
            raise ConfigError(f"batch.ramp.{i}.tokens_per_update", error.message) from None
    ends = [t for t, _ in changes[1:]]
    last_start, last = changes[-1][0], plans[-1].tokens_per_update
    if total_tokens - last_start < last:
        raise ConfigError(
            "train.total_tokens",
            f"got {total_tokens:,}; batch.ramp's last step (B = {last:,} from {last_start:,} tokens) needs at "
            f"least {last_start + last:,} for one update",
        )
    ends.append(last_start + (total_tokens - last_start) // last * last)
    out: List[Segment] = []
    first_b, updates = plans[0].tokens_per_update, 0
    for i, ((start, _), end, plan) in enumerate(zip(changes, ends, plans)):
        B = plan.tokens_per_update
        if end <= start or (end - start) % B:
            whole = start + max(0, end - start) // B * B
            valid = [f"{t:,}" for t in (whole, whole + B) if t > start]
            raise ConfigError(
                f"batch.ramp.{i + 1}.from_tokens",
                f"got {end:,}; segment {i} (B = {B:,} from {start:,} tokens) must be whole updates: "
                f"valid from_tokens {' or '.join(valid)}",
            )
        out.append(Segment(start, end, plan, updates, (B / first_b) ** alpha))
        updates += (end - start) // B  # the updates before the next segment: a running sum, linear in the ramp
    return out


def updates_until(run: Sequence[Segment], tokens: int) -> Optional[int]:
    """The updates taken when `tokens` have been seen; None when no update ends there."""
    for s in run:
        if s.start_tokens <= tokens <= s.end_tokens and (tokens - s.start_tokens) % s.plan.tokens_per_update == 0:
            return s.start_update + (tokens - s.start_tokens) // s.plan.tokens_per_update
    return None


def segment_at(run: Sequence[Segment], tokens: int) -> Segment:
    """The segment whose next update starts at `tokens` (the last one at or past the end)."""
    return next((s for s in run if s.start_tokens <= tokens < s.end_tokens), run[-1])


def segment_ending(run: Sequence[Segment], tokens: float) -> Segment:
    """The segment an update that ends at `tokens` belongs to (start < tokens <= end; the first at
    or before 0, the last past the end): by bisection, so a long ramp's lrs cost log time each."""
    i = bisect.bisect_left(run, tokens, key=lambda s: s.end_tokens)
    return run[min(i, len(run) - 1)]


def ramp_flow(steps: Sequence[Tuple[int, int]]) -> List[str]:
    """Each (from_tokens, tokens_per_update) of a ramp as a YAML flow mapping, as batch.ramp reads it."""
    return [f"{{from_tokens: {int(t)}, tokens_per_update: {int(b)}}}" for t, b in steps]


def ramp_override(steps: Sequence[Tuple[int, int]]) -> str:
    """A ramp as one command-line override, `orchestrator train CONFIG '<this>'` (quoted: it holds
    spaces): batch.ramp=[{from_tokens: 0, tokens_per_update: 8192}, ...]."""
    return "batch.ramp=[" + ", ".join(ramp_flow(steps)) + "]"
