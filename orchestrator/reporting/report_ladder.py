"""A ladder's part of a report (docs/ladders.md): when the trials form a ladder (model.params or
train.total_tokens differs between them) the pipeline adds, beside the single-sweep answer,
report.json's `ladder` (analysis/ladder.to_json), its lines in the summary, one figure per law and,
for a target, `recommended.yaml`: the target's B, lr, warmup, budget and the optimizer constants
the rungs held, on the config of the largest rung's best run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from orchestrator.analysis import ladder, ladder_rungs, optimal_batch, tradeoff
from orchestrator.analysis.trials import Trial
from orchestrator.core import config as config_lib
from orchestrator.core import ladder_target, workload_paths
from orchestrator.core.errors import ConfigError
from orchestrator.core.ladder_target import Target
from orchestrator.formulas import cost
from orchestrator.reporting import recommended, report_tradeoff
from orchestrator.reporting.report_files import Part
from orchestrator.reporting.report_format import G, S, aligned, table
from orchestrator.reporting.report_format import cell as cell_of

FIGURES = {
    "b_star": "ladder_b_star.png",
    "b_opt": "ladder_b_opt.png",
    "b_crit": "ladder_b_crit.png",
    "lr_opt": "ladder_lr_opt.png",
}
LABELS = {
    "b_star": "B* (tokens per update)",
    "b_opt": "B_opt (tokens per update)",
    "b_crit": "B_crit (tokens per update)",
    "lr_opt": "lr_opt (peak learning rate)",
}
RUNG_COLUMNS = [
    ("N", "params", "{:.4g}"),
    ("D", "tokens", "{:.4g}"),
    ("B*", "b_star", S),
    ("lr at B*", "lr_star", S),
    ("largest B within the tolerance", "b_opt", S),
    ("lr there", "lr_opt", S),
    ("B_crit", "b_crit", S),
    ("final loss", "final_loss", G),
    ("batch sizes", "batches", S),
    ("trials", "trials", S),
    ("notes", "notes", S),
]
CLUSTER_NOTE = (
    "cluster.num_workers and batch.micro_batch_size are left for your cluster: num_workers is the "
    "largest rung's ({workers}), set it to yours (tokens_per_update must stay a multiple of "
    "data.seq_len x num_workers); micro_batch_size is auto, which probes the largest that fits."
)


@dataclass(frozen=True)
class Request:
    """What a report asks of a ladder: the target to recommend for (the sweep file's ladder.target,
    or --target-params / --target-tokens)."""

    target: Optional[Target] = None


def analyse(
    trials: Sequence[Trial], request: Optional[Request] = None, tolerance: float = optimal_batch.DEFAULT_TOLERANCE
) -> Optional[ladder.Ladder]:
    """The ladder of `trials` with the report's loss tolerance (ladder.tolerance, --loss-tolerance);
    None when they are not one."""
    if not ladder_rungs.is_ladder(trials):
        return None
    ladder_target.check_rung_count(len(ladder_rungs.group(trials)), "model.params x train.total_tokens")
    request = request or Request()
    target = (request.target.params, request.target.tokens) if request.target else None
    return ladder.analyse(trials, target, tolerance)


def part(result: ladder.Ladder) -> Part:
    """report.json's `ladder`, the figures (the trade-off at the target, one per law) and the
    summary's section: the answer, the trade-off, one row per rung (never their runs pooled)."""
    figures = {}
    if result.tradeoff is not None:
        figures[report_tradeoff.FIGURE] = report_tradeoff.figure(
            result.tradeoff, evidence(result), "the batch-size trade-off at the target"
        )
    figures.update(
        {
            FIGURES[law.name]: _figure(result, law.name)
            for law in result.laws
            if law.fit is not None and law.name in FIGURES
        }
    )
    blocks = [("h2", "Ladder: from the rungs to the target"), *[("p", line) for line in ladder.lines(result)]]
    if result.tradeoff is not None:
        blocks += report_tradeoff.blocks(result.tradeoff, "The batch-size trade-off at the target")
    blocks += [
        ("h2", "The rungs"),
        (
            "p",
            "Each rung (model size N x budget D) analysed on its own: its loss-optimal batch B* and the lr there, "
            "the largest batch within the tolerance of B*'s loss and its lr, its critical batch size and its best "
            "final loss (90% intervals in brackets; bounds as < or >).",
        ),
        table([rung_row(r) for r in result.rungs], RUNG_COLUMNS),
        ("h2", "Laws"),
    ]
    blocks += [("img", file) for file in figures if file != report_tradeoff.FIGURE]
    return Part({"ladder": ladder.to_json(result)}, figures, blocks)


def evidence(result: ladder.Ladder) -> report_tradeoff.Evidence:
    """Each rung's measured best loss per batch size as a share above its own L*, its batch sizes
    rescaled by the target's B* over its own: the rungs' penalties on the target's curve."""
    b_star = result.tradeoff.loss_optimal.tokens_per_update.value
    out = []
    for r in result.rungs:
        if r.b_star.status != "resolved" or not r.loss_star.value:
            continue
        points = [(b * b_star / r.b_star.value, loss / r.loss_star.value - 1) for b, loss in r.measured]
        out.append((f"N={r.params:.3g} D={r.tokens:.3g}" if r.params else f"D={r.tokens:.3g}", points))
    return out


def rung_row(r: ladder_rungs.Rung) -> Dict[str, Any]:
    def shown(e: ladder_rungs.Estimate, fmt: str) -> str:
        if e.value is None:
            return "-"
        bound = {"below": "< ", "above": "> "}.get(e.status, "")
        text = bound + format(e.value, fmt)
        return text + (f" [{format(e.interval[0], fmt)}, {format(e.interval[1], fmt)}]" if e.interval else "")

    return {
        "params": r.params,
        "tokens": r.tokens,
        "b_star": shown(r.b_star, ",.0f"),
        "lr_star": shown(r.lr_star, ".3g"),
        "b_opt": shown(r.b_opt, ",.0f"),
        "lr_opt": shown(r.lr_opt, ".3g"),
        "b_crit": shown(r.b_crit, ",.0f"),
        "final_loss": r.final_loss.value,
        "batches": f"{len(r.batch_sizes)} ({r.batch_sizes[0]:,} - {r.batch_sizes[-1]:,})" if r.batch_sizes else "-",
        "trials": str(r.trials),
        "notes": "; ".join(r.notes) or "-",
    }


def _x(params: Optional[float], tokens: float, by_compute: bool) -> float:
    return cost.training_compute(params, tokens) if by_compute else tokens


def _figure(result: ladder.Ladder, name: str):
    from orchestrator.reporting import plots

    by_compute = all(r.params for r in result.rungs)
    law = result.law(name)
    rungs = [
        (_x(r.params, r.tokens, by_compute), e.value, e.interval)
        for r in result.rungs
        for e in [getattr(r, name)]
        if e.value is not None and e.status == "resolved"
    ]
    line = [(_x(n, d, by_compute), v.value, v.interval) for n, d, v in ladder.along(result, name)]
    fitted = [
        (_x(r.params, r.tokens, by_compute), ladder.fitted_at(result, name, r.params, r.tokens).value)
        for r in result.rungs
    ]
    test = law.backtest
    backtest = (
        (_x(test.held_out[0], test.held_out[1], by_compute), test.predicted, test.interval, test.measured)
        if test is not None and test.predicted is not None
        else None
    )
    rec = result.recommendation
    target = _x(rec.params, rec.tokens, by_compute) if rec else None
    return plots.ladder_law(
        rungs,
        fitted,
        line,
        backtest,
        target,
        f"{law.form}",
        LABELS[name],
        "compute C = 6ND (FLOPs)" if by_compute else "tokens D",
    )


# ---------------------------------------------------------------- recommended.yaml


def params_of(trials: Sequence[Trial], model: Dict[str, Any]) -> int:
    """model.params of the target's model keys on a run's logged config (its data, vocabulary and
    sequence length are the ladder's)."""
    for t in trials:
        try:
            n = workload_paths.compute_params(config_lib.from_dict(recommended.config_of(t.params, model)))
        except ConfigError:
            continue  # a run whose params are no train config of this project
        if n:
            return n
    raise ConfigError("ladder.target.overrides", "no run logged a config to count the target model's parameters on")


def template_run(result: ladder.Ladder, trials: Sequence[Trial]) -> Optional[Trial]:
    """The best run at the batch size nearest B_opt of the largest-compute rung: the recommended
    config is its config (model, data, schedule, tracking, storage) with the target's numbers."""
    largest = result.rungs[-1]
    return next(
        (t for t in trials if t.name == largest.best_run and ladder_rungs.key(t) == (largest.params, largest.tokens)),
        None,
    )


def write_recommended(
    result: ladder.Ladder, trials: Sequence[Trial], target: Optional[Target], out: Path
) -> Optional[Path]:
    """recommended.yaml in `out` for the ladder's target; None (and why, printed) when there is no
    target or no law to read B or lr from."""
    rec = result.recommendation
    if rec is None or target is None:
        print("ladder: no target (ladder.target, or --target-params N --target-tokens D): no recommended.yaml")
        return None
    if rec.tokens_per_update is None or rec.lr is None:
        print("ladder: no B_opt or lr_opt law to recommend from: no recommended.yaml")
        return None
    template = template_run(result, trials)
    if template is None:
        print("ladder: the largest rung's best run is not among the trials: no recommended.yaml")
        return None
    try:
        overrides, why = recommendation(result, target, template.params)
        return recommended.write(out / recommended.FILE, template.params, overrides, why)
    except ConfigError as exc:  # e.g. a table from another trainer whose params are no train config
        print(f"ladder: no recommended.yaml: {exc}")
        return None


def recommendation(result: ladder.Ladder, target: Target, params: Dict[str, Any]):
    """(train-config overrides, the header's sentences) of the target, on a run's `params`."""
    rec = result.recommendation
    cfg = config_lib.from_dict(recommended.config_of(params, {}))
    unit = cfg.data.seq_len * cfg.cluster.num_workers
    batch = max(unit, int(round(rec.tokens_per_update.value / unit)) * unit)
    eta = rec.lr_batch_exponent or 0.0
    lr = rec.lr.value * (batch / rec.tokens_per_update.value) ** eta  # the lr law's B term at the rounded B
    overrides: Dict[str, Any] = {
        "batch.tokens_per_update": batch,
        "optim.lr": float(lr),
        "train.total_tokens": int(target.tokens),
    }
    if rec.warmup_tokens is not None:
        overrides["schedule.warmup_tokens"] = int(round(rec.warmup_tokens.value))
    held = {k: v for k, v in rec.optimizer.items() if v is not None}
    overrides.update(held)
    if "optim.beta2_half_life_tokens" in held:  # one form of each constant: the token form held
        overrides["optim.beta2"] = None
    if "optim.weight_decay_timescale_share" in held:
        overrides["optim.weight_decay"] = None
    overrides.update(target.model or {})
    why = [
        f"The ladder's recommendation for N = {target.params:.4g} parameters (model.params) trained on "
        f"D = {target.tokens:.4g} tokens, {rec.decades:.1f} decades of compute beyond its largest rung "
        "(docs/ladders.md).",
        f"batch.tokens_per_update {batch:,}: {rec.point}, "
        f"{ladder.with_interval(rec.tokens_per_update, ',.0f')} (90% interval), rounded to whole sequences per "
        f"worker ({unit:,} tokens); B_crit there {ladder.with_interval(rec.b_crit, ',.0f')}.",
        f"optim.lr {lr:.4g}: the lr law's prediction there {ladder.with_interval(rec.lr, '.3g')}"
        + (f", moved to the rounded B by its B term (B^{eta:+.2f})." if eta else "."),
    ]
    if result.tradeoff is not None:  # the other point, for a team that wants the loss over the steps
        why += [
            *tradeoff.words(result.tradeoff),
            "For the loss-optimal point instead, set those two keys to B* and its lr.",
        ]
    if rec.warmup_tokens is not None:
        why.append(
            f"schedule.warmup_tokens {overrides['schedule.warmup_tokens']:,}: the rungs' warmup share of their "
            f"budget times D {ladder.with_interval(rec.warmup_tokens, ',.0f')}."
        )
    if held:
        why.append("Held by every rung, in token units: " + ", ".join(f"{k} = {v:g}" for k, v in held.items()) + ".")
    model = "the one ladder.target names" if target.model else "the largest rung's: replace model.* by one of N params"
    why.append(f"The model is {model}; the rest (data, schedule shape, tracking, storage) is its best run's.")
    why.append(CLUSTER_NOTE.format(workers=cfg.cluster.num_workers))
    why += [f"WARNING: {w}." for w in rec.warnings]
    return overrides, why


def lines(result: Optional[ladder.Ladder]) -> List[str]:
    """What the report prints of the ladder, its rungs one row each (nothing when the trials are
    not one)."""
    if result is None:
        return []
    columns = [c for c in RUNG_COLUMNS if c[1] not in ("notes", "trials")]
    rows = [[cell_of(rung_row(r)[key], fmt) for _, key, fmt in columns] for r in result.rungs]
    return ladder.lines(result) + ["rungs:"] + aligned([c[0] for c in columns], rows)
