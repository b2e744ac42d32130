"""What the worker reports between two reports: a window of updates, and when things are due.

`MetricsWindow` accumulates the updates since the last report and turns them into the MLflow
metrics of a report (throughput, MFU, packing efficiency, data shares); `noise_scale_metrics`
gives the noise scale's, with the step they belong at. `due` is the cadence of evaluations,
reports and checkpoints, in tokens. Pure: no Ray, DeepSpeed or MLflow here.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Optional, Tuple

from workloads.builtin.gpt import mfu


def due(before: int, after: int, every: int) -> bool:
    """Did the tokens seen pass a multiple of `every` during this update? (`every` <= 0: never.)
    In tokens, not steps, so every batch size evaluates and checkpoints at the same points."""
    return every > 0 and after // every > before // every


@dataclass(frozen=True)
class UpdateStats:
    """What one optimizer update measured (engine.train_update), over every worker: what a window adds up."""

    loss_sum: float
    """Summed loss over the update's real tokens, all workers."""
    real_tokens: float
    """Loss-bearing tokens of the update, all workers."""
    loss: float
    """loss_sum / real_tokens: train/loss."""
    grad_norm: float
    """The update's gradient norm before clipping (NaN for an fp16 step skipped on overflow)."""
    clipped: float
    """1.0 when the gradient was clipped, else 0.0; NaN when the norm is not finite."""
    small_sq_mean: float
    """Mean squared norm of the micro-batch gradients (the noise scale's small batch)."""
    local_slots: int
    """Sequence slots this worker filled (for packing efficiency)."""
    source_tokens: Dict[str, float]
    """Real tokens per data source, all workers."""
    small_sq_mean_adam: float = float("nan")
    """small_sq_mean of the gradients as AdamW preconditions them (NaN: not measured)."""
    big_sq_adam: float = float("nan")
    """Squared norm of the update's gradient as AdamW preconditions it (NaN: not measured)."""


@dataclass
class MetricsWindow:
    """Accumulators over the updates since the last report."""

    tokens_at_start: int = 0
    loss_sum: float = 0.0
    real_tokens: float = 0.0
    slots: int = 0
    source_tokens: Dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    eval_s: float = 0.0
    """Time spent evaluating inside the window: not training, so not in tokens/s."""

    def add(self, stats: UpdateStats) -> None:
        self.loss_sum += stats.loss_sum
        self.real_tokens += stats.real_tokens
        self.slots += stats.local_slots
        for name, tokens in stats.source_tokens.items():
            self.source_tokens[name] = self.source_tokens.get(name, 0) + tokens

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """Time the block as evaluation, which tokens/s leaves out."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.eval_s += time.perf_counter() - started

    def tokens_per_s(self, tokens: int) -> float:
        elapsed = time.perf_counter() - self.started - self.eval_s
        return (tokens - self.tokens_at_start) / max(elapsed, 1e-9)

    def mean_loss(self) -> float:
        return self.loss_sum / max(self.real_tokens, 1)

    def metrics(self, tokens: int, world: int, flops_per_token: float, peak_flops: Optional[float]) -> Dict[str, float]:
        """The MLflow metrics of a report at `tokens`. `peak_flops` None: MFU is not measured
        (NaN, which the logger drops)."""
        tokens_per_s = self.tokens_per_s(tokens)
        metrics = {
            "train/tokens": tokens,
            "perf/tokens_per_s": tokens_per_s,
            "perf/mfu": mfu(tokens_per_s, flops_per_token, peak_flops) if peak_flops else float("nan"),
            # every worker holds the same number of token slots per update
            "data/packing_efficiency": self.real_tokens / max(self.slots * world, 1),
        }
        real = sum(self.source_tokens.values())
        if real:
            metrics.update({f"data/share/{name}": v / real for name, v in self.source_tokens.items()})
        return metrics


def noise_scale_metrics(gns: Any, suffix: str = "") -> Tuple[int, Dict[str, float]]:
    """(step, metrics) of the noise scale: `gns/*` of a NoiseScaleEMA (None, or no estimate yet:
    no metrics), named with `suffix` (`_adam`: of the gradient as AdamW preconditions it), at
    the EMA's centre of mass in tokens seen. Each update's estimate comes from
    gradients taken at the weights before it (at its first token, like its train/loss); the
    EMA's value is their weighted average, and it belongs at their weighted mean position, where
    it has no first-order lag (noise.NoiseScaleEMA)."""
    if gns is None or gns.b_simple is None:
        return 0, {}
    return round(gns.centre), {
        f"gns/b_simple{suffix}": gns.b_simple,
        f"gns/g_squared{suffix}": gns.g_squared,
        f"gns/trace_sigma{suffix}": gns.trace_sigma,
    }
