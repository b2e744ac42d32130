"""`search.algorithm: grid` and `random`: every trial listed before the sweep starts. A grid search
trains every combination of the space's grids; a random search draws the other keys
`search.num_samples` times per grid point (seeded by search.seed, so the list is reproducible)."""

from __future__ import annotations

from typing import List

import numpy as np

from orchestrator.core.errors import ConfigError
from orchestrator.core.sweep_schema import Sweep
from orchestrator.studies import search_space
from orchestrator.studies.search_space import Values
from orchestrator.studies.study import StudyKind


def _grid_search_of_grids(s: Sweep) -> None:
    if any(next(iter(v)) != "grid" for v in s.space.values()):
        raise ConfigError("search.algorithm", "grid search needs every space key to be a grid; use random or optuna")


def _drawn(sweep: Sweep, draws: int) -> List[Values]:
    """Every grid point with the other keys (lr_scaling's too) drawn `draws` times."""
    rng = np.random.default_rng(sweep.search.seed)
    sampled = {k: v for k, v in sweep.space.items() if "grid" not in v}
    return [
        {**point, **{k: search_space.draw(spec, rng) for k, spec in sampled.items()}}
        for point in search_space.grid_points(sweep.space)
        for _ in range(draws)
    ]


class GridKind(StudyKind):
    name = "grid search"
    algorithm = search_tag = "grid"
    rules = (_grid_search_of_grids,)

    def values(self, sweep: Sweep) -> List[Values]:
        # lr_scaling's base_lr or alpha may be a distribution even in a grid search: drawn then
        sampled = any("grid" not in v for v in sweep.space.values())
        return _drawn(sweep, sweep.search.num_samples if sampled else 1)


class RandomKind(StudyKind):
    name = "random search"
    algorithm = search_tag = "random"

    def values(self, sweep: Sweep) -> List[Values]:
        return _drawn(sweep, sweep.search.num_samples)
