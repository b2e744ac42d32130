"""A ladder (the sweep file's `ladder:` section; docs/ladders.md): model sizes and budgets, every
rung a bracket search over batch size and learning rate, all in one sweep; its rungs are laid out
and checked by studies/ladder_plan.py, its later rungs placed from the finished ones by
bracket_search.LadderSearch (`ladder.predict`), and the laws in N and D fitted across the rungs by
the report."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import Config
from orchestrator.core.sweep_schema import Sweep
from orchestrator.studies import bracket, ladder_plan, search_space
from orchestrator.studies.search_space import Trial, Values


def _ladder_rungs_one_way(s: Sweep) -> None:
    if bool(s.ladder.rungs) == bool(s.ladder.models):
        raise ConfigError(
            "ladder", "give either models with tokens_per_param, or rungs (each {overrides, total_tokens})"
        )
    if s.ladder.models and not s.ladder.tokens_per_param:
        raise ConfigError("ladder.tokens_per_param", "missing: the budgets per parameter, e.g. [0.5, 1, 2]")
    if s.ladder.rungs and s.ladder.tokens_per_param:
        raise ConfigError("ladder.tokens_per_param", "only with ladder.models (rungs give their own total_tokens)")
    if any(r.total_tokens <= 0 or not r.overrides for r in s.ladder.rungs):
        raise ConfigError("ladder.rungs", "each rung is {overrides: {model keys}, total_tokens: N}")


def _ladder_target(s: Sweep) -> None:
    t = s.ladder.target
    if t is not None and (t.tokens is None or (t.params is None) == (t.overrides is None)):
        raise ConfigError(
            "ladder.target",
            "needs tokens and either params or overrides (the target's model), e.g. {params: 1.0e9, tokens: 2.0e10}",
        )


NEEDS = "every rung is a bracket search over batch size and lr: search.algorithm bracket, no branch, no scheduler"


class LadderKind(bracket.BracketKind):
    name = "ladder"
    algorithm = None
    needs = ("ladder", NEEDS)
    takes_scheduler = False
    rules = bracket.RULES + (_ladder_rungs_one_way, _ladder_target)
    refused_keys = {"loss_tolerance": "a ladder's is ladder.tolerance (loss_tolerance is a single sweep's)"}

    def present(self, sweep: Sweep) -> bool:
        return sweep.ladder is not None

    def brackets(self, sweep: Sweep) -> List[Tuple[Values, List[float]]]:
        return bracket.groups(sweep, [r.values for r in ladder_plan.rungs(sweep)])

    def resolve(self, sweep: Sweep, values: Values, base: Optional[Config] = None) -> Trial:
        """A rung's trial keeps the base's warmup share (and, with hold tokens, AdamW's constants)."""
        base = base or search_space.unvalidated_base(sweep)
        budget = values.get("train.total_tokens")
        held = ladder_plan.held(sweep.ladder.hold, base, budget) if budget is not None else None
        return search_space.resolve(sweep, values, base, held)

    def run_tags(self, sweep: Sweep, cfg: Config) -> Dict[str, str]:
        return ladder_plan.rung_tags(sweep, cfg)

    def searcher(self, sweep: Sweep, trials: List[Trial], runs: Dict[str, Any]):
        """Later rungs placed from the finished ones (ladder.predict), else every rung from space."""
        if not sweep.ladder.predict:
            return super().searcher(sweep, trials, runs)
        from orchestrator.studies.bracket_search import LadderSearch

        plans = ladder_plan.rungs(sweep)
        groups = bracket.budgeted(self.brackets(sweep), trials)
        rung_of = [
            next(i for i, r in enumerate(plans) if all(values.get(k) == v for k, v in r.values.items()))
            for values, _, _ in groups
        ]
        s = sweep.search
        return LadderSearch(
            groups,
            [(r.params, r.tokens) for r in plans],
            rung_of,
            search_space.seed_values(sweep),
            s.criterion,
            s.lr_step,
            s.max_lrs_per_batch,
            {**runs, "target_loss": s.target_loss},
            sweep.ladder.tolerance,
        )
