"""Batch sizes on one ordered colour scale, viridis over log B: the report's figures draw with it,
and each trial's MLflow run carries its batch size's colour (mlflow.runColor), so MLflow's charts
colour runs as the report does. matplotlib's colours only, not the figures and the analysis they
import: a trial's process imports this when it opens its run."""

from __future__ import annotations

from typing import Sequence

import matplotlib
import matplotlib.cm
import matplotlib.colors


def batch_scale(batches: Sequence[float]):
    """(colour of a batch size, the ScalarMappable a colour bar draws)."""
    low, high = min(batches), max(batches)
    norm = matplotlib.colors.LogNorm(low, high if high > low else low * 2)
    mappable = matplotlib.cm.ScalarMappable(norm=norm, cmap=matplotlib.colormaps["viridis"])
    return (lambda b: mappable.to_rgba(b)), mappable


def batch_hex(batch: float, batches: Sequence[float]) -> str:
    """The colour ("#rrggbb") of `batch` on the scale of a report over `batches`."""
    colour, _ = batch_scale([*batches, batch])
    return matplotlib.colors.to_hex(colour(batch))
