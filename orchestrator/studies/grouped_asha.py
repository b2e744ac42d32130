"""Early stopping that only compares comparable trials: one ASHA per group.

Ray Tune's ASHA compares every trial with every other at each rung. A sweep over batch sizes
must not: at equal tokens a larger batch has taken fewer optimizer steps and is expected to be
behind early, even when it ends best. `GroupedASHA` keeps one `AsyncHyperBandScheduler` per
group of trials that share the values `search_space.comparison_keys` names (batch size, decay
shape when swept, seed when replicated) and forwards each trial's events to its group's. A group
of one trial is never stopped: ASHA keeps the first trial to reach a rung.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler

from orchestrator.studies.search_space import comparison_group


class GroupedASHA(FIFOScheduler):
    def __init__(self, group_keys: Tuple[str, ...], **asha: Any):
        """`asha`: AsyncHyperBandScheduler arguments (time_attr, metric, mode, max_t, ...)."""
        super().__init__()
        self.group_keys = tuple(group_keys)
        self._asha = dict(asha)
        self._metric = asha.get("metric")
        self._groups: Dict[Tuple[Any, ...], AsyncHyperBandScheduler] = {}
        self._group_of: Dict[str, Tuple[Any, ...]] = {}
        self.stopped_at: Dict[str, int] = {}
        """Trial id -> the rung (in time_attr units) at which early stopping stopped it."""

    def group(self, trial) -> Tuple[Any, ...]:
        """The trial's group, from the sampled values Tune carries in its config."""
        return comparison_group(self.group_keys, trial.config.get("trial", {}))

    def _scheduler(self, trial) -> AsyncHyperBandScheduler:
        key = self._group_of.setdefault(trial.trial_id, self.group(trial))
        if key not in self._groups:
            self._groups[key] = AsyncHyperBandScheduler(**self._asha)
        return self._groups[key]

    def on_trial_add(self, tune_controller, trial) -> None:
        self._scheduler(trial).on_trial_add(tune_controller, trial)

    def on_trial_result(self, tune_controller, trial, result: Dict) -> str:
        action = self._scheduler(trial).on_trial_result(tune_controller, trial, result)
        at = result.get(self._asha["time_attr"])
        if action == self.STOP and at is not None and at < self._asha["max_t"]:
            # Trials report exactly at the rungs (search_space.check_asha_alignment), so the
            # deciding report's tokens are the rung's.
            self.stopped_at.setdefault(trial.trial_id, int(at))
        return action

    def on_trial_complete(self, tune_controller, trial, result: Dict) -> None:
        self._scheduler(trial).on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial) -> None:
        self._scheduler(trial).on_trial_remove(tune_controller, trial)

    def debug_string(self) -> str:
        return "\n".join(
            f"group {dict(zip(self.group_keys, key))}: {s.debug_string()}" for key, s in self._groups.items()
        )
