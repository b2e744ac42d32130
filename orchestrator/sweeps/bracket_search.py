"""`search.algorithm: bracket`: a Ray Tune Searcher that brackets the best learning rate per
batch size (and group of the other grid axes), one orchestrator.analysis.lr_bracket.Bracket each.

It suggests `{"trial": values}`, the form a grid sweep's trials carry (values: the grid values,
`optim.lr` and, with replicates, `train.seed`), so run_trial, trial names, resources, grouped
early stopping and MLflow logging are the same as for a grid sweep. A trial's scores come from
its last result (lr_bracket.scores_of: failed, diverged, non-finite or stopped before its
budget -> +inf); for the `steps` criterion, from the trial's MLflow run, read as the report reads
it (the first crossing of search.target_loss by the monotone fit of train/loss in the part of the
run its schedule cannot fake: trials.Trial.reach), so the searcher and the analysis agree.
`suggest` returns None while every open bracket waits for its round, and FINISHED when every
bracket is done. Its state is JSON (save/restore), so `--resume` continues
the search where it stopped.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Optional, Sequence, Tuple

from ray.tune.search import Searcher

from orchestrator.analysis import lr_bracket
from orchestrator.core import derived, sweep_schema
from orchestrator.sweeps import search_space


def steps_to_target(uri: str, experiment: str, tags: Dict[str, str], target: float) -> float:
    """Optimizer steps the run tagged `tags` took to reach `target` (inf if it did not, or has no run)."""
    from orchestrator.reporting import report_inputs
    from orchestrator.tracking.store import Store

    store = Store(uri, experiment)
    run_id = store.find_run(tags)
    if run_id is None:
        return math.inf
    (trial,) = report_inputs.trials_of(uri, [store.get_run(run_id)])
    tokens = trial.reach(target) if trial.train and trial.batch else None
    return tokens / trial.batch if tokens is not None else math.inf


class BracketSearch(Searcher):
    CKPT_FILE_TMPL = "searcher-state-{}.json"

    def __init__(
        self,
        groups: Sequence[Tuple[Dict[str, Any], Sequence[float], Optional[int]]],
        seeds: Sequence[Dict[str, Any]] = ({},),
        criterion: str = "final_loss",
        step: float = 2.0,
        max_lrs: int = 7,
        runs: Optional[Dict[str, Any]] = None,
    ):
        """`groups`: per (batch size, group) its values, first-round lrs and token budget (None:
        not checked); `seeds`: the replicates' values (search_space.seed_values); `runs`: where
        the trials' MLflow runs are, for the steps criterion ({uri, experiment, tags, target_loss})."""
        # Tune checks that every result holds the searcher's metric: eval_loss, which every trial
        # reports (the scores themselves come from lr_bracket.scores_of).
        super().__init__(metric="eval_loss", mode="min")
        self.criterion = criterion
        self.values = [dict(v) for v, _, _ in groups]
        self.budgets = [b for _, _, b in groups]
        self.seeds = [dict(s) for s in seeds]
        criteria = lr_bracket.criteria_of(criterion)
        self.brackets = [lr_bracket.Bracket(lrs, len(self.seeds), criteria, step, max_lrs) for _, lrs, _ in groups]
        self.trials: Dict[str, Tuple[int, float, int]] = {}
        """Tune trial id -> (bracket, lr, seed index)."""
        self.runs = dict(runs or {})

    @classmethod
    def from_sweep(
        cls, sweep: sweep_schema.Sweep, first_round: Sequence[search_space.Trial], runs: Optional[Dict[str, Any]] = None
    ) -> "BracketSearch":
        """The sweep's brackets that have a feasible first-round trial (`infeasible: skip` drops
        the others); budgets: train.total_tokens rounded down to whole updates. `runs`: the
        store, experiment and tags of the sweep's MLflow runs (the steps criterion reads them)."""

        groups = []
        for point, lrs in search_space.bracket_groups(sweep):
            mine = [t for t in first_round if all(t.values.get(k) == v for k, v in point.items())]
            if mine:
                groups.append((point, lrs, derived.rounded_budget(mine[0].cfg)))
        s = sweep.search
        runs = {**(runs or {}), "target_loss": s.target_loss}
        return cls(groups, search_space.seed_values(sweep), s.criterion, s.lr_step, s.max_lrs_per_batch, runs)

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: Dict, **spec) -> bool:
        return True  # the space is the sweep's; Tune's metric is not what a bracket scores by

    def suggest(self, trial_id: str):
        for i, bracket in enumerate(self.brackets):
            taken = bracket.take()
            if taken is not None:
                lr, k = taken
                self.trials[trial_id] = (i, lr, k)
                return {"trial": {**self.values[i], "optim.lr": lr, **self.seeds[k]}}
        if all(b.done for b in self.brackets):
            return Searcher.FINISHED
        return None  # every open bracket waits for the rest of its round

    def on_trial_complete(self, trial_id: str, result: Optional[Dict] = None, error: bool = False) -> None:
        if trial_id not in self.trials:
            return
        i, lr, k = self.trials[trial_id]
        bracket = self.brackets[i]
        if "steps" in bracket.criteria and not error:
            from orchestrator.tracking.run_tags import TRIAL_TAG

            r = self.runs
            tags = {**r["tags"], TRIAL_TAG: trial_id}
            result = {
                **(result or {}),
                "steps_to_target": steps_to_target(r["uri"], r["experiment"], tags, r["target_loss"]),
            }
        bracket.record(lr, k, lr_bracket.scores_of(result, error, bracket.criteria, self.budgets[i]))

    # ---------------------------------------------------------------- state (JSON, never a pickle)

    def save(self, checkpoint_path: str) -> None:
        state = {
            "criterion": self.criterion,
            "values": self.values,
            "budgets": self.budgets,
            "seeds": self.seeds,
            "brackets": [b.to_json() for b in self.brackets],
            "trials": {t: list(v) for t, v in self.trials.items()},
            "runs": self.runs,
        }
        with open(checkpoint_path, "w") as f:
            json.dump(state, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path) as f:
            state = json.load(f)
        self.criterion = state["criterion"]
        self.values, self.budgets, self.seeds = state["values"], state["budgets"], state["seeds"]
        self.brackets = [lr_bracket.Bracket.from_json(b) for b in state["brackets"]]
        self.trials = {t: (int(i), float(lr), int(k)) for t, (i, lr, k) in state["trials"].items()}
        self.runs = state.get("runs", {})
