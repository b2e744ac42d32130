"""`search.algorithm: optuna`: Optuna's TPE sampler (through Ray Tune's OptunaSearch) proposes
`search.num_samples` configurations of the space while the sweep runs, so no trial is listed
before it starts; the dry run prices the corners of the space instead (studies/corners.py)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import Config
from orchestrator.core.sweep_schema import Sweep
from orchestrator.studies import corners, search_space
from orchestrator.studies.search_space import Trial
from orchestrator.studies.study import DryRunLines, Prepared, Search, StudyKind, counted
from orchestrator.tracking.run_tags import PARENT_TAG


def _one_seed(s: Sweep) -> None:
    if s.search.seeds > 1:
        raise ConfigError(
            "search.seeds",
            f"got {s.search.seeds}; replicates need search.algorithm grid, random or bracket "
            "(optuna proposes one configuration at a time)",
        )


class OptunaKind(StudyKind):
    name = "Optuna search"
    algorithm = search_tag = "optuna"
    rules = (_one_seed,)
    own_keys = ("search.optuna_storage",)

    def plan(self, sweep: Sweep, base: Config) -> Prepared:
        return Prepared(self, sweep, base, search_space.unvalidated_base(sweep), None)

    def describe(self, sweep: Sweep, trials: Optional[List[Trial]]) -> str:
        return f"{sweep.search.num_samples} trials"

    def search(self, sweep: Sweep, trials: Optional[List[Trial]], runs: Dict[str, Any]) -> Search:
        from ray import tune
        from ray.tune.search.optuna import OptunaSearch

        dists = {
            "grid": tune.choice,
            "choice": tune.choice,
            "uniform": lambda a: tune.uniform(*a),
            "loguniform": lambda a: tune.loguniform(*a),
            "randint": lambda a: tune.randint(a[0], a[1] + 1),
        }
        space = {"trial": {k: dists[next(iter(s))](next(iter(s.values()))) for k, s in sweep.space.items()}}
        storage = None
        if sweep.search.optuna_storage:  # a study optuna-dashboard can open, one per sweep run
            import optuna

            storage = optuna.storages.RDBStorage(sweep.search.optuna_storage)
        searcher = OptunaSearch(
            metric=sweep.search.metric,
            mode="min",
            seed=sweep.search.seed,
            storage=storage,
            study_name=f"{sweep.name} {runs['tags'][PARENT_TAG][:8]}" if storage else None,
        )
        return Search(space, searcher, sweep.search.num_samples)

    def dry_run(self, prepared: Prepared, lines: DryRunLines) -> List[str]:
        sweep = prepared.sweep
        n, slots = sweep.search.num_samples, sweep.search.max_concurrent
        title = (
            f"sweep {sweep.name!r}: Optuna search, {counted(n, 'trial')} (search.num_samples), "
            f"{slots} at a time; the trials are proposed while it runs, so here is the space and the range of cost"
        )
        keys, trials = corners.corners(sweep)
        return lines.ranged(prepared, title, keys, trials, n)
