"""`search.algorithm: bracket`: the learning rate bracketed per batch size (and group of the other
grid axes) by the searcher of studies/bracket_search.py, from a first round of fixed lrs (optim.lr's
grid, or lr_scaling's guess / step, guess, guess x step). The trials listed before the sweep starts
are that first round; the searcher proposes the rest, up to search.max_lrs_per_batch per batch
size, group and seed."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from orchestrator.analysis import lr_bracket
from orchestrator.core import derived
from orchestrator.core.errors import ConfigError
from orchestrator.core.sweep_file import is_number, lr_space
from orchestrator.core.sweep_schema import LR_KEYS, Sweep
from orchestrator.studies import search_space
from orchestrator.studies.search_space import Trial, Values
from orchestrator.studies.study import DryRunLines, Prepared, Search, StudyKind, counted


def _bracket_batch_grid(s: Sweep) -> None:
    """A bracket search finds the lr per batch size: a grid of them."""
    batch = s.space.get("batch.tokens_per_update", {})
    if "grid" not in batch:
        raise ConfigError(
            "space.batch.tokens_per_update",
            f"got {batch or 'nothing'}; search.algorithm bracket finds the lr per batch size: "
            "valid: a grid, e.g. {grid: [2048, 4096]}",
        )


def _bracket_first_lrs(s: Sweep) -> None:
    """A bracket search starts from fixed lrs: optim.lr's grid, or lr_scaling's guess."""
    lrs = s.space.get("optim.lr")
    if lrs is None and not s.lr_scaling:
        raise ConfigError(
            "space.optim.lr", "missing; search.algorithm bracket starts from {grid: [...]} here or from lr_scaling"
        )
    if lrs is not None and ("grid" not in lrs or not all(is_number(x) and x > 0 for x in lrs["grid"])):
        raise ConfigError(
            "space.optim.lr", f"got {lrs}; search.algorithm bracket starts from a grid of learning rates > 0"
        )


def _bracket_rule_of_numbers(s: Sweep) -> None:
    """lr_scaling's guess, which a bracket search brackets, from a fixed base_lr > 0 and alpha."""
    for key, spec in lr_space(s.lr_scaling).items():
        values = spec.get("grid", [])
        if len(values) != 1 or (key == "lr_scaling.base_lr" and not values[0] > 0):
            raise ConfigError(
                key,
                f"got {getattr(s.lr_scaling, key.partition('.')[2])!r}; search.algorithm bracket needs a fixed number"
                + (" > 0" if key == "lr_scaling.base_lr" else "")
                + " (it brackets the lr around the rule's guess)",
            )


def _bracket_groups_of_grids(s: Sweep) -> None:
    """The other space keys are the groups a bracket search finds an lr in: grids."""
    for key, spec in s.space.items():
        if "grid" not in spec:
            raise ConfigError(f"space.{key}", f"got {spec}; search.algorithm bracket needs a grid (the groups)")


def _bracket_target_loss(s: Sweep) -> None:
    if s.search.criterion in ("steps", "both") and s.search.target_loss is None:
        raise ConfigError(
            "search.target_loss",
            f"missing; search.criterion {s.search.criterion} scores an lr by its steps to this train loss "
            "(e.g. a loss every batch size reaches before its decay)",
        )


def _bracket_first_round_fits(s: Sweep) -> None:
    lrs = s.space.get("optim.lr")
    first = len(set(lrs["grid"])) if lrs is not None and "grid" in lrs else 3
    if s.search.max_lrs_per_batch < first:
        raise ConfigError(
            "search.max_lrs_per_batch",
            f"got {s.search.max_lrs_per_batch}; must be at least the {first} learning rates of the first round",
        )


RULES = (
    _bracket_batch_grid,
    _bracket_first_lrs,
    _bracket_rule_of_numbers,
    _bracket_groups_of_grids,
    _bracket_target_loss,
    _bracket_first_round_fits,
)


def groups(sweep: Sweep, rungs: Sequence[Values] = ({},)) -> List[Tuple[Values, List[float]]]:
    """The (batch size, group) brackets: the grid values (batch and the other axes, not the lr;
    `rungs`' values, a ladder's model and budget, first) and the first round's learning rates,
    optim.lr's grid or lr_scaling's guess / step, guess, guess x step."""
    axes = {k: v for k, v in sweep.space.items() if k != "optim.lr" and k not in LR_KEYS}
    found = []
    for point in [{**rung, **p} for rung in rungs for p in search_space.grid_points(axes)]:
        if "optim.lr" in sweep.space:
            lrs = sorted({lr_bracket.round_lr(x) for x in sweep.space["optim.lr"]["grid"]})
        else:
            rule = {k: sweep.space[k]["grid"][0] for k in LR_KEYS}
            tokens = point["batch.tokens_per_update"] / sweep.lr_scaling.reference_tokens
            guess = rule["lr_scaling.base_lr"] * tokens ** rule["lr_scaling.alpha"]
            lrs = lr_bracket.initial_from_rule(guess, sweep.search.lr_step)
        found.append((point, lrs))
    return found


def budgeted(brackets, first_round: Sequence[Trial]):
    """(values, first-round lrs, budget) of the brackets that have a feasible first-round trial
    (`infeasible: skip` drops the others); budgets: train.total_tokens rounded down to whole updates."""
    out = []
    for point, lrs in brackets:
        mine = [t for t in first_round if all(t.values.get(k) == v for k, v in point.items())]
        if mine:
            out.append((point, lrs, derived.rounded_budget(mine[0].cfg)))
    return out


class BracketKind(StudyKind):
    name = "bracket search"
    algorithm = search_tag = "bracket"
    rules = RULES
    bounded = True
    lone_trials = (
        "first-round trials have no such peer and are not stopped early (the search's later lrs are compared with them)"
    )

    def brackets(self, sweep: Sweep) -> List[Tuple[Values, List[float]]]:
        return groups(sweep)

    def values(self, sweep: Sweep) -> List[Values]:
        return [{**point, "optim.lr": lr} for point, lrs in self.brackets(sweep) for lr in lrs]

    def bound(self, sweep: Sweep) -> int:
        """The most trials it runs: max_lrs_per_batch x batch sizes x groups x seeds."""
        return len(self.brackets(sweep)) * sweep.search.max_lrs_per_batch * sweep.search.seeds

    def searcher(self, sweep: Sweep, trials: List[Trial], runs: Dict[str, Any]):
        from orchestrator.studies.bracket_search import BracketSearch

        s = sweep.search
        return BracketSearch(
            budgeted(self.brackets(sweep), trials),
            search_space.seed_values(sweep),
            s.criterion,
            s.lr_step,
            s.max_lrs_per_batch,
            {**runs, "target_loss": s.target_loss},
        )

    def search(self, sweep: Sweep, trials: Optional[List[Trial]], runs: Dict[str, Any]) -> Search:
        return Search({}, self.searcher(sweep, trials or [], runs), self.bound(sweep))

    def describe(self, sweep: Sweep, trials: Optional[List[Trial]]) -> str:
        s = sweep.search
        return (
            f"bracket search of the learning rate per batch size, criterion {s.criterion} (search.criterion), "
            f"step {s.lr_step:g}; first round {len(trials or [])} trials, at most {self.bound(sweep)} "
            f"({s.max_lrs_per_batch} lrs per batch size and group)"
        )

    def dry_run(self, prepared: Prepared, lines: DryRunLines) -> List[str]:
        """Its first round, then the cost range up to its bound: max_lrs_per_batch lrs per batch
        size, group and seed."""
        sweep, s = prepared.sweep, prepared.sweep.search
        batches = len(sweep.space["batch.tokens_per_update"]["grid"])
        per_batch = len(self.brackets(sweep)) // batches
        first = len(prepared.trials or [])

        def title(bound: int) -> str:
            return (
                f"sweep {sweep.name!r}: bracket search of the learning rate per batch size, criterion "
                f"{s.criterion} (search.criterion), step {s.lr_step:g}; first round {counted(first, 'trial')}, "
                f"at most {bound} (search.max_lrs_per_batch {s.max_lrs_per_batch} x {counted(batches, 'batch size')} "
                f"x {counted(per_batch, 'group')} x {counted(s.seeds, 'seed')}); nothing started"
            )

        return lines.bounded(prepared, title, s.max_lrs_per_batch)
