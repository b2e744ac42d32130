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
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from ray.tune.search import Searcher

from orchestrator.analysis import lr_bracket


def steps_to_target(uri: str, experiment: str, tags: Dict[str, str], target: float) -> float:
    """Optimizer steps the run tagged `tags` took to reach `target` (inf if it did not, or has no run)."""
    from orchestrator.reporting import report_inputs
    from orchestrator.tracking.run_tags import PARENT_TAG, REUSED_BY_PREFIX, TRIAL_TAG
    from orchestrator.tracking.store import Store

    store = Store(uri, experiment)
    run_id = store.find_run(tags)
    if run_id is None and PARENT_TAG in tags and TRIAL_TAG in tags:  # a finished run it reused
        run_id = store.find_run({REUSED_BY_PREFIX + tags[PARENT_TAG]: tags[TRIAL_TAG]})
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

    def _open(self, i: int) -> bool:
        """Whether bracket i may hand out trials now (LadderSearch holds a rung back)."""
        return True

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: Dict, **spec) -> bool:
        return True  # the space is the sweep's; Tune's metric is not what a bracket scores by

    def suggest(self, trial_id: str):
        for i, bracket in enumerate(self.brackets):
            taken = bracket.take() if self._open(i) else None
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


class LadderSearch(BracketSearch):
    """A ladder's bracket search (docs/ladders.md): every rung a group of brackets, as in
    BracketSearch, served smallest compute first. The first PLACE_AFTER rungs start from the
    sweep's space at once; each later rung waits until every smaller rung's brackets are done,
    then its first round is placed from what those rungs predict (analysis/ladder_placement.py:
    its batch sizes around the predicted B_opt and B_crit, the others skipped; its lrs around the
    predicted best lr), and bracketed as today. While the finished rungs predict nothing, a rung
    keeps the space's first round. At an lr step of at most REFINE_ABOVE_STEP no bracket gets the
    refinement round: the laws pool every rung's best lrs, each read from the parabola through its
    best lr and neighbours, and three lrs that close put the parabola's vertex where the refinement
    would (benchmarks/replay_search.py: the held-out answer no worse without it). At
    a coarser step the vertex of three lrs a factor 2 apart is worth its refinement (the shipped CPU
    ladder's lr law, docs/benchmarks.md "ladder_run")."""

    PLACE_AFTER = 1
    """Rungs that start at once: the first; every later one is placed from the finished ones."""
    REFINE_ABOVE_STEP = 1.5
    """The lr step above which a ladder's brackets keep the refinement round (sqrt 2 does not)."""

    def __init__(
        self,
        groups: Sequence[Tuple[Dict[str, Any], Sequence[float], Optional[int]]],
        rungs: Sequence[Tuple[float, float]],
        rung_of: Sequence[int],
        seeds: Sequence[Dict[str, Any]] = ({},),
        criterion: str = "final_loss",
        step: float = 2.0,
        max_lrs: int = 7,
        runs: Optional[Dict[str, Any]] = None,
        tolerance: float = 0.005,
        finished: Optional[Callable[[], Sequence[Any]]] = None,
    ):
        """`rungs`: (N, D) of each rung, smallest compute first; `rung_of`: the rung of each group;
        `finished`: the sweep's trials so far as analysis records (default: read from its MLflow
        runs, `runs`)."""
        super().__init__(groups, seeds, criterion, step, max_lrs, runs)
        for b in self.brackets:
            b.refine = step > self.REFINE_ABOVE_STEP
        self.rungs = [(float(n), float(d)) for n, d in rungs]
        self.rung_of = [int(r) for r in rung_of]
        self.released = [r < self.PLACE_AFTER for r in range(len(self.rungs))]
        self.tolerance = tolerance
        self.placed: Dict[int, Dict[str, Any]] = {}
        """rung -> what placed it (B_opt, B_crit, lr_opt predicted, batch sizes), for the log and state."""
        self.finished = finished or self._read_finished

    def _read_finished(self):
        from orchestrator.reporting import report_inputs
        from orchestrator.tracking.run_tags import PARENT_TAG

        return report_inputs.read_trials(self.runs["uri"], self.runs["tags"][PARENT_TAG])

    def _open(self, i: int) -> bool:
        self._release()
        return self.released[self.rung_of[i]]

    def _release(self) -> None:
        """Release, in order, every held rung whose smaller rungs are all done, placing it."""
        for rung, released in enumerate(self.released):
            if released:
                continue
            if not all(b.done for i, b in enumerate(self.brackets) if self.rung_of[i] < rung):
                return  # a larger rung waits too: rungs run smallest first
            self._place(rung)
            self.released[rung] = True

    def _place(self, rung: int) -> None:
        from orchestrator.analysis import ladder_placement

        mine = [i for i, r in enumerate(self.rung_of) if r == rung]
        grid = sorted({int(self.values[i]["batch.tokens_per_update"]) for i in mine})
        step = self.brackets[mine[0]].step
        placement = ladder_placement.place(self.finished(), *self.rungs[rung], grid, step, self.tolerance)
        if placement is None:
            return
        for i in mine:
            old, batch = self.brackets[i], int(self.values[i]["batch.tokens_per_update"])
            if batch in placement.lrs:
                self.brackets[i] = lr_bracket.Bracket(
                    placement.lrs[batch], old.seeds, old.criteria, old.step, old.max_lrs, old.refine
                )
            else:
                old.skip(f"outside the placed batch sizes {list(placement.batches)}")
        self.placed[rung] = {
            "b_opt": placement.b_opt,
            "b_crit": placement.b_crit,
            "lr_opt": placement.lr_opt,
            "batches": list(placement.batches),
            "from_rungs": placement.rungs,
        }
        print(
            f"ladder rung N={self.rungs[rung][0]:.3g} D={self.rungs[rung][1]:.3g}: first round placed from "
            f"{placement.rungs} finished rungs: B_opt {placement.b_opt:,.0f}, lr {placement.lr_opt:.3g}, "
            f"batch sizes {list(placement.batches)}"
        )

    def save(self, checkpoint_path: str) -> None:
        super().save(checkpoint_path)
        with open(checkpoint_path) as f:
            state = json.load(f)
        state["ladder"] = {
            "rungs": self.rungs,
            "rung_of": self.rung_of,
            "released": self.released,
            "tolerance": self.tolerance,
            "placed": {str(k): v for k, v in self.placed.items()},
        }
        with open(checkpoint_path, "w") as f:
            json.dump(state, f)

    def restore(self, checkpoint_path: str) -> None:
        super().restore(checkpoint_path)
        with open(checkpoint_path) as f:
            ladder = json.load(f)["ladder"]
        self.rungs = [tuple(r) for r in ladder["rungs"]]
        self.rung_of, self.released = list(ladder["rung_of"]), list(ladder["released"])
        self.tolerance = float(ladder["tolerance"])
        self.placed = {int(k): v for k, v in ladder["placed"].items()}
