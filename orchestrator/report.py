"""`orchestrator report`: which batch size and learning rate to use, where the critical batch size
lies and what each choice costs, read back from a sweep's (or one run's) MLflow runs.

Reading (MLflow, only through tracking.py) gives `Trial` records; `analyse` is pure arithmetic on
them and returns a plain dict (report.json); writing turns it into figures (plots.py), summary.md
and summary.html, all logged to the sweep's (or the run's) MLflow run under `report/`.

Rules, so that a reader can check every number (batch sizes and budgets are in tokens):
- Final loss: the last eval/loss point when every trial logged eval/loss, else train/loss
  smoothed (centred moving average of SMOOTH_WINDOW logged points) at its end.
- Reaching a target loss: the first crossing of the smoothed train/loss (noise.steps_to_reach);
  train/loss is logged far more often than eval/loss, so it places the crossing more finely.
- Targets when none are given: L_w = the worst, over batch sizes, of each batch size's best final
  smoothed train loss (so the best run of every batch size reaches it), L_0 = the median initial
  loss; targets are L_w + f (L_0 - L_w) for f in TARGET_FRACTIONS. The primary target (the one
  `sweep` prints) is the lowest target that gave a fit.
- Per batch size the trial reaching a target in the fewest steps gives (B_j, S_j, E_j = S_j B_j);
  S = S_min + E_min / B is fitted, B_crit = E_min / S_min with a 90% bootstrap interval. B_simple:
  each such trial's gns/b_simple at the tokens where it reaches the target, median over B_j.
- Best configuration and best lr per batch size: lowest final loss among trials that did not
  fail (a FAILED run still counts for when it reached a target).
- Wall time to reach a target ~ run duration x tokens to reach / tokens seen (includes start-up).
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from orchestrator import noise, tracking
from orchestrator.errors import ConfigError

SMOOTH_WINDOW = 5
TARGET_FRACTIONS = (0.02, 0.1, 0.25)
METRICS = ("train/loss", "eval/loss", "gns/b_simple")
Curve = List[Tuple[int, float]]


@dataclass
class Trial:
    """One run as the analysis needs it: settings parsed from params, curves as (tokens, value)."""

    run_id: str
    name: str
    status: str
    batch: Optional[int]  # batch.tokens_per_update
    lr: Optional[float]  # optim.lr
    settings: Dict[str, Any]  # warmup_tokens, decay, min_lr_ratio
    train: Curve
    eval: Curve
    b_simple: Curve
    duration_s: Optional[float]

    @property
    def tokens_seen(self) -> int:
        return self.train[-1][0] if self.train else 0

    def final(self, metric: str) -> Optional[float]:
        if metric == "eval/loss":
            return self.eval[-1][1] if self.eval else None
        return float(_smooth([v for _, v in self.train])[-1]) if self.train else None

    def reach(self, target: float) -> Optional[Tuple[float, float]]:
        """(steps, tokens) at which the smoothed train loss first reaches target."""
        tokens, losses = zip(*self.train)
        return noise.steps_to_reach(tokens, losses, self.batch, target, window=SMOOTH_WINDOW)

    def b_simple_at(self, tokens: float) -> Optional[float]:
        return float(np.interp(tokens, *zip(*self.b_simple))) if self.b_simple else None


def _smooth(values: Sequence[float], window: int = SMOOTH_WINDOW) -> np.ndarray:
    """Centred moving average, shrinking at the ends (as noise.steps_to_reach smooths)."""
    v, half = np.asarray(values, dtype=float), window // 2
    return np.array([v[max(0, i - half): i + half + 1].mean() for i in range(len(v))])


def _number(params: Dict[str, str], key: str, kind=float) -> Any:
    try:
        return kind(float(params[key]))
    except (KeyError, TypeError, ValueError):
        return None


# ---------------------------------------------------------------- reading (MLflow via tracking)


def _tracking_for(target: str, overrides: List[str]) -> Tuple[Optional[str], str, str]:
    """(sweep name when target is a sweep file, tracking uri, experiment). The `tracking.*` entries
    of a sweep file's `base.overrides` name its store; the command line's overrides win."""
    import yaml

    from orchestrator import config

    name, extra = None, []
    if target.endswith((".yaml", ".yml")) or Path(target).is_file():
        if not Path(target).is_file():
            raise ConfigError("SWEEP_OR_RUN", f"sweep file {target} not found")
        data = yaml.safe_load(Path(target).read_text())
        if not isinstance(data, dict) or not data.get("name"):
            raise ConfigError("name", f"sweep file {target} has no top-level `name:`; valid: a sweep YAML with name")
        base = data.get("base") if isinstance(data.get("base"), dict) else {}
        raw = base.get("overrides") or []
        raw = [f"{k}={v}" for k, v in raw.items()] if isinstance(raw, dict) else raw
        name, extra = str(data["name"]), [str(o) for o in raw if str(o).startswith("tracking.")]
    cfg = config.load(None, extra + list(overrides))
    return name, tracking.resolve_uri(cfg.tracking.uri), cfg.tracking.experiment


def resolve(target: str, overrides: List[str]) -> Tuple[str, str, str]:
    """(tracking uri, report name, run id of the sweep's parent run or of the single run)."""
    sweep_name, uri, experiment = _tracking_for(target, overrides)
    if not tracking.store_exists(uri):
        raise ConfigError("tracking.uri", f"no MLflow store at {uri}; pass tracking.uri=<the store of the sweep>")
    run = None if sweep_name else tracking.try_get_run(uri, target)
    if run is not None:
        return uri, run.info.run_name or run.info.run_id, run.info.run_id
    sweep_name = sweep_name or target
    run_id = tracking.find_sweep_run_anywhere(uri, sweep_name, experiment)
    if run_id is None:
        raise ConfigError("SWEEP_OR_RUN", f"no sweep named {sweep_name!r} (run tagged orchestrator.role=sweep, "
                          f"orchestrator.sweep={sweep_name!r}) and no run with that id in {uri} "
                          f"(searched experiment {experiment!r}, then all)")
    return uri, sweep_name, run_id


def read_trials(uri: str, run_id: str) -> List[Trial]:
    """The sweep's child runs, or the run itself when it has none."""
    trials = []
    runs = tracking.child_runs(uri, run_id) or [tracking.get_run(uri, run_id)]
    for r in sorted(runs, key=lambda r: r.info.start_time):
        curves, p = tracking.run_metrics(uri, r.info.run_id, METRICS), r.data.params
        start, end = r.info.start_time, r.info.end_time
        settings = {"warmup_tokens": _number(p, "schedule.warmup_tokens", int), "decay": p.get("schedule.decay"),
                    "min_lr_ratio": _number(p, "schedule.min_lr_ratio")}
        trials.append(Trial(r.info.run_id, r.info.run_name or r.info.run_id[:8], r.info.status,
                            _number(p, "batch.tokens_per_update", int), _number(p, "optim.lr"), settings,
                            *(curves[k] for k in METRICS), (end - start) / 1000 if end and start else None))
    return trials


# ---------------------------------------------------------------- analysis (pure)


def by_batch(trials: Sequence[Trial]) -> Dict[int, List[Trial]]:
    groups: Dict[int, List[Trial]] = {}
    for t in sorted(trials, key=lambda t: t.batch):
        groups.setdefault(t.batch, []).append(t)
    return groups


def choose_targets(trials: Sequence[Trial]) -> List[float]:
    """Loss levels the best run of every batch size reaches (rule in the module docstring)."""
    worst_of_best = max(min(t.final("train/loss") for t in group) for group in by_batch(trials).values())
    start = float(np.median([_smooth([v for _, v in t.train])[0] for t in trials]))
    if start <= worst_of_best:
        return [worst_of_best]
    return [worst_of_best + f * (start - worst_of_best) for f in sorted(TARGET_FRACTIONS)]


def critical_batch(trials: Sequence[Trial], target: float) -> Dict[str, Any]:
    """Per batch size the trial reaching target in the fewest steps, and the fit S = S_min + E_min / B."""
    points, missing, notes = [], [], []
    for b, group in by_batch(trials).items():
        hits = [(hit, t) for t in group if (hit := t.reach(target))]
        if not hits:
            missing.append(b)
            continue
        (steps, tokens), t = min(hits, key=lambda h: h[0][0])
        wall_s = t.duration_s * min(1.0, tokens / t.tokens_seen) if t.duration_s is not None else None
        points.append({"batch": b, "steps": steps, "tokens": tokens, "lr": t.lr, "run_id": t.run_id,
                       "run_name": t.name, "wall_s": wall_s, "b_simple": t.b_simple_at(tokens)})
    fit, interval = (None, None, None), None
    if len(points) >= 2:
        bs, ss = [p["batch"] for p in points], [p["steps"] for p in points]
        fit, interval = noise.fit_critical_batch(bs, ss), noise.bootstrap_b_crit(bs, ss)
        if fit[1] == 0:
            notes.append("steps do not fall as B grows (E_min = 0): every B here is past B_crit, or the data are noisy")
        elif fit[0] == 0:
            notes.append("steps fall as 1/B throughout (S_min = 0): B_crit lies beyond the largest B")
    else:
        notes.append(f"B_crit needs at least 2 batch sizes that reach this loss; {len(points)} did")
    if missing:
        notes.append("not reached by batch sizes " + ", ".join(f"{b:,}" for b in missing))
    measured = [p["b_simple"] for p in points if p["b_simple"] is not None]
    if not measured:
        notes.append("no gns/b_simple metric in these runs (gns.enabled=false?)")
    return {"target_loss": target, "points": points, "missing": missing, "s_min": fit[0], "e_min": fit[1],
            "b_crit": fit[2], "b_crit_interval": interval, "b_simple": float(np.median(measured)) if measured else None,
            "notes": notes}


def lr_scaling(trials: Sequence[Trial], metric: str) -> Dict[str, Any]:
    """Best lr per batch size (lowest final loss) and the power law lr_opt ~ coef * B^alpha."""
    best = []
    for b, group in by_batch(trials).items():
        scored = [(t.final(metric), t) for t in group if t.lr and t.final(metric) is not None]
        if scored:
            loss, t = min(scored, key=lambda s: s[0])
            best.append({"batch": b, "lr": t.lr, "final_loss": loss, "run_id": t.run_id, "run_name": t.name})
    if len(best) < 2:
        return {"best": best, "coef": None, "alpha": None, "note": "the lr power law needs at least 2 batch sizes"}
    coef, alpha = noise.power_law_fit([p["batch"] for p in best], [p["lr"] for p in best])
    return {"best": best, "coef": coef, "alpha": alpha, "note": None}


def analyse(trials: Sequence[Trial], target_losses: Optional[Sequence[float]] = None) -> Dict[str, Any]:
    usable = [t for t in trials if t.batch and t.train]
    if not usable:
        raise ValueError("no trial has both batch.tokens_per_update and a train/loss curve")
    completed = [t for t in usable if t.status != "FAILED"] or usable
    metric = "eval/loss" if all(t.eval for t in completed) else "train/loss"
    targets = sorted(target_losses) if target_losses else choose_targets(completed)
    fits = [critical_batch(usable, L) for L in targets]
    return {
        "loss_metric": metric, "targets_chosen": not target_losses, "critical_batch": fits,
        "primary": next((f for f in fits if f["b_crit"] is not None), fits[0]),
        "lr_scaling": lr_scaling(completed, metric),
        "best": _row(min(completed, key=lambda t: t.final(metric)), metric),
        "trials": [_row(t, metric) for t in usable], "skipped": [t.name for t in trials if t not in usable],
    }


def _row(t: Trial, metric: str) -> Dict[str, Any]:
    return {"run_id": t.run_id, "run_name": t.name, "status": t.status, "batch": t.batch, "lr": t.lr, **t.settings,
            "final_loss": t.final(metric), "final_train": t.final("train/loss"), "final_eval": t.final("eval/loss"),
            "tokens": t.tokens_seen, "wall_s": t.duration_s}


# ---------------------------------------------------------------- writing


def _n(x: Any, fmt: str = "{:.4g}") -> str:
    """A table cell: '-' when missing, 'inf' when infinite; fmt "tok" for token counts."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    from orchestrator.plots import fmt_tokens

    return fmt_tokens(round(x)) if fmt == "tok" else fmt.format(x)


def answer(result: Dict[str, Any]) -> str:
    """One paragraph: the best configuration, B_crit and B_simple."""
    b, p, alpha = result["best"], result["primary"], result["lr_scaling"]["alpha"]
    text = (f"Best configuration: B = {_n(b['batch'], 'tok')} tokens per update, lr = {_n(b['lr'])}, warmup "
            f"{_n(b['warmup_tokens'], 'tok')} tokens, {b['decay'] or '?'} decay: final {result['loss_metric']} "
            f"{_n(b['final_loss'])} (run {b['run_name']}).")
    if p["b_crit"] is not None:
        lo, hi = p["b_crit_interval"]
        text += (f" At loss {p['target_loss']:.4g} the critical batch size is B_crit = {_n(p['b_crit'], 'tok')} "
                 f"tokens (90% bootstrap {_n(lo, 'tok')} - {_n(hi, 'tok')}, from {len(p['points'])} batch sizes"
                 + "".join(f"; {note}" for note in p["notes"]) + ")")
    else:
        text += f" No critical batch size at loss {p['target_loss']:.4g} ({'; '.join(p['notes'])})"
    text += f"; measured B_simple there: {_n(p['b_simple'], 'tok')} tokens." if p["b_simple"] else "; no B_simple."
    return text + (f" The best learning rate scales as B^{round(alpha, 2) + 0.0:.2f}." if alpha is not None else "")


def figures(trials: Sequence[Trial], result: Dict[str, Any], name: str) -> Dict[str, Any]:
    from orchestrator import plots

    usable, metric, scaling = [t for t in trials if t.batch and t.train], result["loss_metric"], result["lr_scaling"]
    curves = [{"batch": t.batch, "train": t.train, "eval": t.eval} for t in usable]
    figs = {"loss_vs_tokens.png": plots.loss_by_batch(curves, "tokens", f"{name}: loss vs tokens"),
            "loss_vs_steps.png": plots.loss_by_batch(curves, "steps", f"{name}: loss vs optimizer steps")}
    cells = [(t.lr, t.batch, t.final(metric)) for t in usable if t.lr and t.final(metric) is not None]
    if cells:
        figs["eval_heatmap.png"] = plots.lr_batch_heatmap(cells, f"final {metric}")
    fits = [{**f, "points": [(p["batch"], p["steps"], p["tokens"]) for p in f["points"]]}
            for f in result["critical_batch"] if f["points"]]
    if fits:
        figs["critical_batch.png"] = plots.critical_batch(fits)
    if scaling["best"]:
        fit = (scaling["coef"], scaling["alpha"]) if scaling["alpha"] is not None else None
        figs["lr_vs_batch.png"] = plots.lr_vs_batch([(t.batch, t.lr) for t in usable if t.lr],
                                                    [(p["batch"], p["lr"]) for p in scaling["best"]], fit)
    return figs


G, S, TOK = "{:.4g}", "{}", "tok"  # cell formats: number, text, token count
BEST_ROWS = [("batch size (tokens per update)", "batch", TOK), ("peak learning rate", "lr", G),
             ("warmup tokens", "warmup_tokens", TOK), ("decay", "decay", S), ("min lr ratio", "min_lr_ratio", G),
             ("final eval/loss", "final_eval", G), ("final train/loss (smoothed)", "final_train", G),
             ("run", "run_name", S), ("run id", "run_id", S)]
TARGET_COLUMNS = [("target loss", "target_loss", G), ("B_crit", "b_crit", TOK), ("90% interval", "interval", S),
                  ("B_simple", "b_simple", TOK), ("S_min", "s_min", G), ("E_min", "e_min", TOK),
                  ("batch sizes", "n", S), ("notes", "note", S)]
COST_COLUMNS = [("batch size", "batch", TOK), ("steps", "steps", "{:,.0f}"), ("tokens", "tokens", "{:,.0f}"),
                ("wall time (s)", "wall_s", "{:.1f}"), ("lr", "lr", G), ("B_simple", "b_simple", TOK),
                ("run", "run_name", S)]
LR_COLUMNS = [("batch size", "batch", TOK), ("best lr", "lr", G), ("final loss", "final_loss", G),
              ("run", "run_name", S)]
TRIAL_COLUMNS = [("run", "run_name", S), ("status", "status", S), ("batch", "batch", TOK), ("lr", "lr", G),
                 ("warmup", "warmup_tokens", TOK), ("decay", "decay", S), ("final train", "final_train", G),
                 ("final eval", "final_eval", G), ("tokens", "tokens", "{:,}"), ("wall (s)", "wall_s", "{:.1f}")]


def _table(rows: Sequence[Dict[str, Any]], columns: Sequence[Tuple[str, str, str]]) -> tuple:
    return ("table", [c[0] for c in columns], [[_n(row.get(key), fmt) for _, key, fmt in columns] for row in rows])


def document(result: Dict[str, Any], name: str, images: Sequence[str]) -> List[tuple]:
    """The summary as blocks: ("h1".."h3", text), ("p", text), ("table", header, rows), ("img", file)."""
    best, scaling, metric, src = result["best"], result["lr_scaling"], result["loss_metric"], result.get("source", {})
    targets = [{**f, "n": len(f["points"]), "note": "; ".join(f["notes"]) or "-",
                "interval": " - ".join(_n(x, TOK) for x in f["b_crit_interval"] or [])}
               for f in result["critical_batch"]]
    how = "chosen automatically" if result["targets_chosen"] else "given"
    law = scaling["note"] if scaling["alpha"] is None else f"lr_opt ~ {scaling['coef']:.3g} x B^{scaling['alpha']:.3f}"
    doc = [("h1", f"Report: {name}"), ("p", answer(result)),
           ("p", f"{len(result['trials'])} trials of {src.get('kind', '?')} run {src.get('run_id', '?')} in "
                 f"{src.get('uri', '?')}; final losses compared on {metric}."),
           ("h2", "Best configuration"),
           ("table", ["setting", "value"], [[label, _n(best[key], fmt)] for label, key, fmt in BEST_ROWS]),
           ("h2", "Critical batch size"),
           ("p", f"Target losses {how}; S = S_min + E_min / B fitted to each batch size's fastest trial; "
                 "B_crit = E_min / S_min; B_simple = median gns/b_simple where those trials reach the target "
                 "(rules: orchestrator/report.py)."),
           _table(targets, TARGET_COLUMNS)]
    for f in targets:
        doc += [("h3", f"Cost to reach loss {f['target_loss']:.4g}"), _table(f["points"], COST_COLUMNS)]
    doc += [("h2", "Learning rate vs batch size"), ("p", f"Best lr per batch size (lowest final {metric}): {law}."),
            _table(scaling["best"], LR_COLUMNS), ("h2", "Figures"), *[("img", f) for f in images],
            ("h2", "All trials"), _table(result["trials"], TRIAL_COLUMNS)]
    if result["skipped"]:
        doc.append(("p", "Skipped (no batch.tokens_per_update or no train/loss): " + ", ".join(result["skipped"])))
    return doc


def to_markdown(doc: Sequence[tuple]) -> str:
    lines = []
    for kind, *rest in doc:
        if kind == "table":
            lines += ["| " + " | ".join(rest[0]) + " |", "|" + " --- |" * len(rest[0])]
            lines += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rest[1]]
        elif kind == "img":
            lines.append(f"![{rest[0]}]({rest[0]})")
        else:
            lines.append(rest[0] if kind == "p" else "#" * int(kind[1]) + " " + rest[0])
        lines.append("")
    return "\n".join(lines)


def to_html(doc: Sequence[tuple], title: str) -> str:
    e = html.escape

    def cells(row: Sequence[Any], tag: str) -> str:
        return "<tr>" + "".join(f"<{tag}>{e(str(c))}</{tag}>" for c in row) + "</tr>"

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>body{{font-family:"
             "sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
             "padding:3px 8px;text-align:right}img{max-width:100%}</style></head><body>"]
    for kind, *rest in doc:
        if kind == "table":
            parts.append("<table>" + cells(rest[0], "th") + "".join(cells(r, "td") for r in rest[1]) + "</table>")
        elif kind == "img":
            parts.append(f"<p><img src='{e(rest[0])}' alt='{e(rest[0])}'></p>")
        else:
            parts.append(f"<{kind}>{e(rest[0])}</{kind}>")
    return "\n".join(parts + ["</body></html>"])


def _json_safe(x: Any) -> Any:
    """Plain JSON: numpy scalars to Python, non-finite floats to null."""
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    x = x.item() if isinstance(x, np.generic) else x
    return None if isinstance(x, float) and not math.isfinite(x) else x


def write_report(trials: Sequence[Trial], result: Dict[str, Any], name: str, out: Path) -> List[Path]:
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for file, fig in figures(trials, result, name).items():
        fig.savefig(out / file, dpi=120)
        plt.close(fig)
        written.append(out / file)
    doc = document(result, name, [p.name for p in written])
    for file, text in (("summary.md", to_markdown(doc)), ("summary.html", to_html(doc, f"Report: {name}")),
                       ("report.json", json.dumps(_json_safe({"name": name, **result}), indent=2))):
        (out / file).write_text(text)
        written.append(out / file)
    return written


def run(target: str, overrides: List[str], out: Optional[str] = None,
        target_losses: Optional[List[float]] = None) -> int:
    """The `report` verb: target is a sweep file, a sweep name or a run id; returns the exit code."""
    uri, name, run_id = resolve(target, list(overrides))
    trials = read_trials(uri, run_id)
    if not any(t.batch and t.train for t in trials):
        print(f"orchestrator report: nothing to report: no run under {run_id} has train/loss and "
              "batch.tokens_per_update")
        return 1
    result = analyse(trials, target_losses)
    result["source"] = {"uri": uri, "run_id": run_id, "kind": "single" if trials[0].run_id == run_id else "sweep"}
    out_dir = Path(out) if out else Path("reports") / re.sub(r"[^\w.-]+", "_", name)
    for path in write_report(trials, result, name, out_dir):
        tracking.log_file(uri, run_id, path, "report")
    print(f"report: {out_dir / 'summary.md'} (and summary.html, report.json; logged to run {run_id} under report/)")
    print(answer(result))
    return 0


def critical_batch_summary(uri: str, parent_run_id: str,
                           target_losses: Optional[Sequence[float]] = None) -> Dict[str, Any]:
    """B_crit, its 90% interval and B_simple at the primary target loss (for `sweep` to print)."""
    try:
        p = analyse(read_trials(uri, parent_run_id), target_losses)["primary"]
    except ValueError as exc:
        return {"b_crit": None, "b_crit_interval": None, "b_simple": None, "target_loss": None, "notes": [str(exc)]}
    return {k: p[k] for k in ("b_crit", "b_crit_interval", "b_simple", "target_loss", "s_min", "e_min", "notes")}
