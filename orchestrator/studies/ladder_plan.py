"""A ladder's rungs (docs/ladders.md): each model of `ladder.models` at each budget of
`ladder.tokens_per_param` (or `ladder.rungs` as given), with its model.params N and budget D,
smallest compute first; and the target the ladder recommends for. Pure but for the workload's
cost function, named by its import path (core/workload_paths.py): no Ray, no MLflow.

A budget of tokens_per_param x N is rounded to whole updates of the largest batch size the
sweep's space names, so every batch size of a rung sees the same tokens (comparisons at equal
tokens, docs/design.md 4.6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from orchestrator.core import config as config_lib
from orchestrator.core import derived, ladder_target, workload_paths
from orchestrator.core.errors import ConfigError
from orchestrator.core.ladder_target import model_params as _params
from orchestrator.core.schema import Config
from orchestrator.core.sweep_schema import Sweep
from orchestrator.formulas import batching, cost
from orchestrator.tracking.run_tags import RUNG_TAG

TOTAL_KEY = "train.total_tokens"


@dataclass(frozen=True)
class RungPlan:
    """One rung: its model (overrides of the base), N and D."""

    model: Dict[str, Any]
    params: int
    """N: model.params of its model."""
    tokens: int
    """D: its budget, train.total_tokens."""

    @property
    def compute(self) -> float:
        return cost.training_compute(self.params, self.tokens)

    @property
    def values(self) -> Dict[str, Any]:
        """What a trial of this rung sets on the base config (Tune's param space carries it)."""
        return {**self.model, TOTAL_KEY: self.tokens}

    @property
    def label(self) -> str:
        """`N=213k D=426k`: how trial names and the report name the rung."""
        return label(self.params, self.tokens)


def label(params: float, tokens: float) -> str:
    return f"N={_short(params)} D={_short(tokens)}"


def rung_tags(sweep: Sweep, cfg: Config) -> Dict[str, str]:
    """The tag of a ladder trial's MLflow run naming its rung (RUNG_TAG: `N=213k D=426k`, its
    model.params and budget), so the runs of one rung can be filtered in the UI; {} outside a
    ladder."""
    if sweep.ladder is None:
        return {}
    return {RUNG_TAG: label(workload_paths.compute_params(cfg) or 0, cfg.train.total_tokens)}


def _short(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:g}"


def _largest_batch(sweep: Sweep) -> int:
    grid = sweep.space.get("batch.tokens_per_update", {}).get("grid") or [1]
    return int(max(grid))


def rungs(sweep: Sweep) -> List[RungPlan]:
    """The rungs of the sweep's ladder, smallest compute first ([] without a ladder), each checked
    before any rung trains: a model sets no key the grid or the ladder sets for it (it would be
    replaced silently); a budget fits the base's warmup share with more than one update of the
    largest batch and is at most batching.MAX_TOTAL_TOKENS; two entries of the same N and D (a
    model listed twice) are refused, not merged; and the target is a train config beyond the
    largest rung's compute, checked as the report will build it."""
    ladder = sweep.ladder
    if ladder is None:
        return []
    ladder_target.check_rung_count(len(ladder.rungs) + len(ladder.models) * len(ladder.tokens_per_param), "ladder")
    unit = _largest_batch(sweep)
    for key, model in [(f"ladder.rungs.{i}.overrides", r.overrides) for i, r in enumerate(ladder.rungs)] + [
        (f"ladder.models.{i}", m) for i, m in enumerate(ladder.models)
    ]:
        _sets_nothing_the_ladder_sets(sweep, key, model)
    found = [  # (the entry's key, its budget's key, the rung)
        (f"ladder.rungs.{i}", f"ladder.rungs.{i}.total_tokens", RungPlan(dict(r.overrides), n, int(r.total_tokens)))
        for i, r in enumerate(ladder.rungs)
        for n in [_params(sweep, r.overrides, f"ladder.rungs.{i}.overrides")]
    ]
    for i, model in enumerate(ladder.models):
        n = _params(sweep, model, f"ladder.models.{i}")
        for ratio in ladder.tokens_per_param:
            tokens = max(unit, int(round(ratio * n / unit)) * unit)
            found.append((f"ladder.models.{i}", "ladder.tokens_per_param", RungPlan(dict(model), n, tokens)))
    shortest = _shortest_budget(sweep, unit)
    seen: Dict[Tuple[int, int], int] = {}
    for index, (where, budget_key, rung) in enumerate(found):
        if not shortest <= rung.tokens <= batching.MAX_TOTAL_TOKENS:
            raise ConfigError(
                budget_key,
                f"a budget of {rung.tokens:,} tokens for the model of N = {rung.params:,} ({where}); valid: "
                f"{shortest:,} (the base's warmup share is then more than one update of the largest batch, "
                f"{unit:,}) to {batching.MAX_TOTAL_TOKENS:,}",
            )
        earlier = seen.setdefault((rung.params, rung.tokens), index)
        if earlier != index:  # a model listed twice, or two of its budgets rounded to one
            first = found[earlier][0]
            raise ConfigError(
                where if first != where else budget_key,
                f"the same N = {rung.params:,} and D = {rung.tokens:,} as {first}: a ladder tells its rungs apart "
                "by N and D, so list each model once, give models of different sizes and budgets that differ",
            )
    laid_out = sorted((rung for _, _, rung in found), key=lambda r: (r.compute, r.params))
    goal = ladder_target.target(sweep)
    if goal is not None and decades_beyond(laid_out, goal.params, goal.tokens) <= 0:
        raise ConfigError(
            "ladder.target",
            f"N = {goal.params:,.0f}, D = {goal.tokens:,.0f} is not beyond the largest rung ({laid_out[-1].label}): "
            "a ladder extrapolates up, so give a target of more compute (6 N D) than its rungs",
        )
    return laid_out


def _sets_nothing_the_ladder_sets(sweep: Sweep, key: str, model: Dict[str, Any]) -> None:
    """A rung's model keys: none of the swept ones, the budget or the warmup the ladder holds."""
    for name in model:
        if name in sweep.space or name in (TOTAL_KEY, "schedule.warmup_tokens"):
            setter = "the sweep's space" if name in sweep.space else "the ladder"
            raise ConfigError(
                f"{key}.{name}", f"{setter} sets it for every rung, so a model's own would be replaced; leave it out"
            )


def _shortest_budget(sweep: Sweep, unit: int) -> int:
    """The smallest budget a rung can train: one update of the largest batch, and a warmup (the
    base's share of the budget, as `held` keeps it) longer than one update when the base warms up."""
    base = config_lib.load(sweep.base_config, sweep.base_overrides)
    share = base.schedule.warmup_tokens / base.train.total_tokens
    return unit if share <= 0 else max(unit, math.ceil((unit + 1) / share))


def target(sweep: Sweep) -> Optional[Tuple[float, float, Optional[Dict[str, Any]]]]:
    """(N, D, the target's model overrides or None) of the ladder's target; None without one."""
    found = ladder_target.target(sweep)
    return (found.params, found.tokens, found.model) if found else None


def held(hold: str, base: Config, budget: int) -> Dict[str, Any]:
    """What a rung's trial sets so that it keeps the base's warmup as a share of its budget and,
    with hold `tokens`, AdamW's beta2 and weight decay in their token forms at the base's batch
    size and budget (docs/ladders.md says why; core/derived.adamw_constants reads them back)."""
    s, o = base.schedule, base.optim
    out: Dict[str, Any] = {"schedule.warmup_tokens": int(round(s.warmup_tokens / base.train.total_tokens * budget))}
    if hold != "tokens" or o.name != "adamw":
        return out
    batch = base.batch.tokens_per_update
    constants = derived.adamw_constants(base)
    if o.beta2_half_life_tokens is None and 0 < constants.beta2 < 1:
        out["optim.beta2"] = None
        out["optim.beta2_half_life_tokens"] = batch * math.log(0.5) / math.log(constants.beta2)
    if o.weight_decay_timescale_share is None and constants.weight_decay > 0 and o.lr > 0:
        out["optim.weight_decay"] = None
        out["optim.weight_decay_timescale_share"] = batch / (o.lr * constants.weight_decay * base.train.total_tokens)
    return out


def decades_beyond(rung_list: List[RungPlan], n: float, d: float) -> float:
    """How many decades of compute the target lies past the largest rung."""
    return cost.decades_beyond(n, d, max(r.compute for r in rung_list)) if rung_list else math.nan
