"""From small runs to the big run: a ladder of sweeps at several model sizes N and budgets D,
hyperparameter laws across it, and a recommendation for a target (N, D) nobody can afford to sweep.
Pure (numpy and scipy); reporting writes what `to_json` and `lines` give. docs/ladders.md says how
to read it and when not to trust it.

- Rungs (ladder_rungs.py): the trials grouped by (`model.params`, `train.total_tokens`); per rung
  B_opt (optimal_batch.py's rule), lr_opt (the best lr at B_opt), B_crit (the sweep's own
  critical-batch study) and the best final loss, each with a seed-bootstrap interval.
- Laws (ladder_laws.py), in logs, weighted by each rung's own spread:
  lr_opt = a N^alpha D^beta (at B_opt); B_opt = b D^gamma and B_crit = c D^delta, each with an N
  term fitted, reported and dropped when its interval holds 0 (B_crit over the rungs whose status
  is resolved). The best lr's slope in B near B_opt, eta, is measured within the rungs; when its
  interval excludes 0 the data demand a B term and the lr law becomes lr_opt (B / B_opt)^eta for
  other batch sizes (at B_opt itself it changes nothing). Each law is backtested on its
  largest-compute rung.
- Where rungs' loss surfaces resolve a loss-optimal batch B* (loss_surface.py): laws of B*, of the
  loss there (above an irreducible floor) and of the penalties at B* / 2 and 2 B* (pooled when
  neither N nor D moves them); at the target they give the penalty curve and its two points
  (tradeoff.py). Every law's interval is widened by its leave-one-rung-out misses where they
  exceed its spread (ladder_laws.calibration).
- Recommendation at the target: tokens per update = the largest batch within the tolerance of
  B*'s predicted loss (where no rung has a B*, the B_opt law's prediction; B_crit's beside it),
  peak lr = the lr law's there, warmup = the rungs' warmup share of their budget (median; the
  interval is the range of shares they ran: the ladder held it, it did not measure an optimum)
  times the target's D; the optimizer's constants in token units when every rung held the same
  ones; the decades of compute beyond the largest rung; warnings past two decades or when a
  law missed its backtest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from orchestrator.analysis import ladder_laws, ladder_rungs, optimal_batch, tradeoff
from orchestrator.analysis.ladder_laws import Backtest, Design, Point, Value
from orchestrator.analysis.ladder_rungs import OPTIMIZER_KEYS, Rung
from orchestrator.analysis.trials import Trial, in_one_order
from orchestrator.formulas import cost

MAX_DECADES = 2.0
"""Beyond this many decades of compute past the largest rung the recommendation warns."""
LAWS = {
    # name: (symbol, prefactor, exponent names, variables dropped when their interval holds 0);
    # B_opt first: the lr law with a B term is read at its prediction.
    "b_opt": ("B_opt", "b", {"N": "nu", "D": "gamma", "C": "epsilon"}, ("N",)),
    "b_crit": ("B_crit", "c", {"N": "mu", "D": "delta", "C": "epsilon"}, ("N",)),
    "lr_opt": ("lr_opt", "a", {"N": "alpha", "D": "beta", "C": "epsilon", "B": "eta"}, ()),
    # The loss-optimal point and the penalty curve around it (tradeoff.py), fitted where the rungs'
    # loss surfaces resolve B*; the penalties pooled (a constant) when neither N nor D moves them.
    "b_star": ("B*", "s", {"N": "nu", "D": "gamma", "C": "epsilon"}, ("N",)),
    "loss_star": ("L*", "l", {"N": "alpha", "D": "beta", "C": "epsilon"}, ()),
    "penalty_half": ("penalty(B*/2)", "p", {"N": "alpha", "D": "beta", "C": "epsilon"}, ("N", "D", "C")),
    "penalty_double": ("penalty(2B*)", "q", {"N": "alpha", "D": "beta", "C": "epsilon"}, ("N", "D", "C")),
}
SURFACE_LAWS = ("b_star", "loss_star", "penalty_half", "penalty_double")


@dataclass(frozen=True, eq=False)
class Law:
    name: str
    form: str
    status: str
    """fitted | not fitted (notes say why)."""
    prefactor: Optional[Value]
    exponents: Dict[str, Value]
    """Keyed N, D (or C), and B for the lr law when the data demand a B term."""
    dropped: Dict[str, Value]
    """Terms fitted, reported and dropped because their interval holds 0."""
    rungs: int
    prediction: Optional[Value]
    backtest: Optional[Backtest]
    notes: Tuple[str, ...]
    fit: Optional[ladder_laws.Fit] = None
    prediction_draws: Optional[np.ndarray] = None
    """The prediction's resamples at the target (to pair with another law's)."""

    def to_json(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "form": self.form,
            "status": self.status,
            "coefficients": (
                {"prefactor": self.prefactor.to_json(), **({"floor": self.fit.floor} if self.fit.floor else {})}
                if self.prefactor
                else {}
            ),
            "exponents": {k: v.to_json() for k, v in self.exponents.items()},
            "dropped": {k: v.to_json() for k, v in self.dropped.items()},
            "rungs": self.rungs,
            "prediction": self.prediction.value if self.prediction else None,
            "prediction_interval": list(self.prediction.interval)
            if self.prediction and self.prediction.interval
            else None,
            "backtest": self.backtest.to_json() if self.backtest else None,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Recommendation:
    params: float
    tokens: float
    tokens_per_update: Optional[Value]
    b_crit: Optional[Value]
    lr: Optional[Value]
    lr_batch_exponent: Optional[float]
    """eta when the lr law has a B term: lr at another batch B is lr x (B / tokens_per_update)^eta."""
    warmup_tokens: Optional[Value]
    optimizer: Dict[str, Optional[float]]
    decades: float
    """log10 of the target's compute over the largest rung's."""
    warnings: Tuple[str, ...]
    tolerance: float = optimal_batch.DEFAULT_TOLERANCE
    """The share of the loss traded for a larger batch: tokens_per_update is the largest batch whose
    predicted penalty against B* is within it (ladder.tolerance, report --loss-tolerance)."""
    loss_optimal: Optional[tradeoff.LossOptimal] = None
    """B*, its lr and its predicted loss; None when no rung's loss surface resolves B* (the loss
    keeps falling to the smallest batch tried: tokens_per_update is then the B_opt law's)."""
    predicted_loss_penalty: Optional[Value] = None
    steps_saved: Optional[Value] = None
    point: str = "the B_opt law (no rung resolves a loss-optimal batch)"
    """Which point tokens_per_update and lr are, in words."""

    def to_json(self) -> Dict[str, Any]:
        def value(v):
            return v.to_json() if v else None

        return {
            "params": self.params,
            "tokens": self.tokens,
            "tokens_per_update": value(self.tokens_per_update),
            "b_crit": value(self.b_crit),
            "lr": value(self.lr),
            "lr_batch_exponent": self.lr_batch_exponent,
            "warmup_tokens": value(self.warmup_tokens),
            "optimizer": self.optimizer,
            "decades_extrapolated": self.decades,
            "warnings": list(self.warnings),
            "tolerance": self.tolerance,
            "point": self.point,
            "loss_optimal": value(self.loss_optimal),
            "predicted_loss_penalty": value(self.predicted_loss_penalty),
            "steps_saved": value(self.steps_saved),
        }


@dataclass(frozen=True, eq=False)
class Ladder:
    rungs: Tuple[Rung, ...]
    laws: Tuple[Law, ...]
    design: Design
    recommendation: Optional[Recommendation]
    tolerance: float
    resamples: int
    seed: int
    tradeoff: Optional[tradeoff.Tradeoff] = None
    """At the target, when the laws of B* and the penalties are fitted."""

    def law(self, name: str) -> Law:
        return next(law for law in self.laws if law.name == name)


def analyse(
    trials: Sequence[Trial],
    target: Optional[Tuple[float, float]] = None,
    tolerance: float = optimal_batch.DEFAULT_TOLERANCE,
    resamples: int = ladder_rungs.RESAMPLES,
    seed: int = ladder_rungs.SEED,
) -> Ladder:
    """The ladder of `trials` (ladder_rungs.is_ladder says whether they are one) and, with a
    target (params, tokens), its recommendation."""
    rungs = tuple(ladder_rungs.rungs(in_one_order(trials), tolerance, resamples, seed))
    if not rungs:
        raise ValueError("no run has batch.tokens_per_update, train.total_tokens and a train/loss curve")
    design = ladder_laws.design_of([Point(r.params, r.tokens, 1.0) for r in rungs])
    b_opt = _law("b_opt", rungs, design, target, seed)
    laws = (
        b_opt,
        _law("b_crit", rungs, design, target, seed + 1),
        _law("lr_opt", rungs, design, target, seed + 2, b_opt),
    )
    if any(r.b_star.status == "resolved" for r in rungs):  # a loss-optimal batch somewhere: its laws
        laws += tuple(_law(name, rungs, design, target, seed + 3 + i) for i, name in enumerate(SURFACE_LAWS))
    found = _tradeoff(laws, target, tolerance) if target else None
    recommendation = _recommend(rungs, laws, design, target, tolerance, found) if target else None
    return Ladder(rungs, laws, design, recommendation, tolerance, resamples, seed, found)


def _points(name: str, rungs: Sequence[Rung]) -> List[Point]:
    if name in SURFACE_LAWS:  # the rungs whose loss surface resolves B*; a penalty's draws in logs
        logged = name in ("b_star", "loss_star")
        return [
            Point(r.params, r.tokens, e.value, draws if logged else np.log(np.where(draws > 0, draws, np.nan)))
            for r in rungs
            for e in [getattr(r, name)]
            if r.draws.surface is not None and e.status == "resolved" and e.value is not None and e.value > 0
            for draws in [getattr(r.draws.surface, "draws_" + name)]
        ]
    if name == "b_opt":
        return [
            Point(r.params, r.tokens, r.b_opt.value, r.draws.log_b_opt) for r in rungs if r.b_opt.status == "resolved"
        ]
    if name == "lr_opt":
        return [
            Point(r.params, r.tokens, r.lr_opt.value, r.draws.log_lr_opt)
            for r in rungs
            if r.lr_opt.status == "resolved" and r.b_opt.status == "resolved"
        ]
    return [
        Point(r.params, r.tokens, r.b_crit.value, r.draws.log_b_crit) for r in rungs if r.b_crit.status == "resolved"
    ]


def _law(
    name: str, rungs: Sequence[Rung], ladder_design: Design, target, seed: int, b_opt: Optional[Law] = None
) -> Law:
    symbol, prefactor, names, drop = LAWS[name]
    points = _points(name, rungs)
    notes = [f"{len(rungs) - len(points)} rung(s) left out: no resolved {symbol}"] if len(points) < len(rungs) else []
    if name in SURFACE_LAWS and len(points) < len(rungs):
        notes = [f"{len(rungs) - len(points)} rung(s) left out: their loss surface does not resolve B*"]
    design = ladder_laws.design_of(points) if points else ladder_design
    notes += [design.note] if design.note else []
    fit_points, measured = points, None
    if name == "lr_opt" and points:
        fit_points, design, measured, note = _batch_term(rungs, points, design, b_opt, seed)
        notes += [note] if note else []
    floor = name == "loss_star"  # a loss falls towards an irreducible part: L* = E + l N^alpha D^beta
    try:
        fitted, dropped = ladder_laws.drop_if_zero(
            fit_points, design, drop, seed, keep_one=name not in SURFACE_LAWS, floor=floor
        )
    except ValueError as e:
        return Law(name, f"{symbol}: not fitted", "not fitted", None, {}, {}, len(points), None, None, (*notes, str(e)))
    factor, widened = ladder_laws.calibration(fit_points, fitted.design, seed + 200, floor)
    fitted = fitted.widened(factor)
    notes += [widened] if widened else []
    prediction, boots = None, None
    if target:
        at_b_opt = (b_opt.prediction.value, b_opt.prediction_draws) if "B" in fitted.design.variables else ()
        value, boots = fitted.prediction(*target, *at_b_opt)
        prediction = Value(value, ladder_laws.interval_of(boots))
    test = ladder_laws.backtest(fit_points, fitted.design, seed + 100, measured, floor)
    if test.held is False:
        notes.append(
            f"missed its backtest: predicted {test.predicted:.4g} for the largest rung, measured {test.measured:.4g}"
        )
    form = f"{symbol} = {prefactor} " + " ".join(f"{v}^{names[v]}" for v in fitted.design.variables)
    if floor:
        form = f"{symbol} = E + {prefactor} " + " ".join(f"{v}^{names[v]}" for v in fitted.design.variables)
        e = Value(fitted.floor, ladder_laws.interval_of(np.asarray(fitted.floor_draws)))
        notes.append(f"E = {with_interval(e, '.4g')}, the irreducible loss the rungs point to")
    if not fitted.design.variables:
        form = f"{symbol} = {prefactor} (the same at every rung: pooled)"
    return Law(
        name,
        form + (", read at B = B_opt" if "B" in fitted.design.variables else ""),
        "fitted",
        fitted.prefactor(),
        {v: fitted.exponent(v) for v in fitted.design.variables},
        dict(dropped),
        len(points),
        prediction,
        test,
        tuple(notes),
        fitted,
        boots,
    )


def _batch_term(rungs: Sequence[Rung], points: List[Point], design: Design, b_opt: Optional[Law], seed: int):
    """(points, design, the backtest's measurement, a note) of the lr law. When the best lr's
    pooled slope in B near B_opt has an interval that excludes 0, the data demand a B term: the law
    is then fitted to the best lr of every batch size near B_opt, lr = a N^alpha D^beta B^eta (not
    to each rung's lr at its own B_opt, which carries that B_opt's noise times eta), read at the
    B_opt law's prediction, and backtested on the held-out rung's lr_opt at its B_opt."""
    near = [r.draws.lr_near for r in rungs]
    eta = ladder_laws.batch_slope([(n.sxx, n.sxy_point, n.sxy_draws) for n in near], seed)
    if eta is None:
        return points, design, None, None
    if eta.interval and eta.interval[0] <= 0 <= eta.interval[1]:
        return points, design, None, f"no B term: the best lr's slope in B near B_opt, {eta.value:+.2f}, holds 0"
    if b_opt is None or b_opt.fit is None:
        return points, design, None, "the best lr changes with B, but without a B_opt law there is no B to read it at"
    held = max(points, key=lambda p: (p.compute, p.tokens))
    b_of_held = next(r.b_opt.value for r in rungs if (r.params, r.tokens) == (held.params, held.tokens))
    measured = Point(held.params, held.tokens, held.value, held.log_draws, b_of_held)
    note = f"a B term: the best lr changes with B near B_opt (slope {eta.value:+.2f}, interval excludes 0)"
    return _batch_points(rungs, points), design.with_batch(), measured, note


def _batch_points(rungs: Sequence[Rung], at_b_opt: Sequence[Point]) -> List[Point]:
    """The best lr of every batch size near B_opt, of the rungs the lr law uses."""
    used = {(p.params, p.tokens) for p in at_b_opt}
    return [
        Point(r.params, r.tokens, float(np.exp(y)), near.near_log_lr_draws[..., j], float(b), i)
        for i, r in enumerate(rungs)
        if (r.params, r.tokens) in used
        for near in [r.draws.lr_near]
        for j, (b, y) in enumerate(zip(near.near_batches, near.near_log_lr))
    ]


def lr_reader(law: Law, params: Optional[float], tokens: float) -> tradeoff.LrAt:
    """The lr law at (N, D) as a function of the batch (its B term; without one, the same at every B)."""

    def lr_at(batch: float, batch_draws: Optional[np.ndarray]):
        if law.fit is None:
            return None, None
        if "B" not in law.fit.design.variables:
            return law.fit.prediction(params or 1.0, tokens)
        return law.fit.prediction(params or 1.0, tokens, batch, batch_draws)

    return lr_at


def _tradeoff(laws: Sequence[Law], target, tolerance: float) -> Optional[tradeoff.Tradeoff]:
    """The penalty curve at the target from the laws of B* and the penalties (their resamples paired
    by index), the lr law for the lr at each batch; None unless all three predict."""
    by_name = {law.name: law for law in laws}
    needed = [by_name.get(name) for name in ("b_star", "penalty_half", "penalty_double")]
    if any(law is None or law.prediction is None for law in needed):
        return None
    curve = tradeoff.Curve.of(*((law.prediction.value, law.prediction_draws) for law in needed))
    loss = by_name["loss_star"].prediction if "loss_star" in by_name else None
    return tradeoff.tradeoff(curve, lr_reader(by_name["lr_opt"], *target), target[1], tolerance, loss)


def _recommend(
    rungs: Sequence[Rung],
    laws: Sequence[Law],
    design: Design,
    target,
    tolerance: float = optimal_batch.DEFAULT_TOLERANCE,
    found: Optional[tradeoff.Tradeoff] = None,
) -> Recommendation:
    params, tokens = target
    by_name = {law.name: law for law in laws}
    largest = max(r.compute or 0.0 for r in rungs)
    decades = cost.decades_beyond(params, tokens, largest)
    warnings = []
    if round(decades, 1) > MAX_DECADES:  # as printed: "2.0 decades" is not more than 2
        warnings.append(
            f"the target lies {decades:.1f} decades of compute beyond the largest rung (more than {MAX_DECADES:g})"
        )
    for law in laws:
        if law.status != "fitted":
            warnings.append(f"no {law.name} law: " + (law.notes[-1] if law.notes else "too few rungs"))
        elif law.backtest and law.backtest.held is False:
            warnings.append(f"the {law.name} law missed its backtest on the largest rung: distrust its prediction")
        elif law.backtest and law.backtest.untested:
            warnings.append(f"the {law.name} law's backtest is {law.backtest.note}: its prediction is untested")
    if design.variables == ("C",):
        ratio = np.median([r.tokens / r.params for r in rungs])
        if not 1 / ladder_laws.SHARED_RATIO <= (tokens / params) / ratio <= ladder_laws.SHARED_RATIO:
            warnings.append(
                f"the target has {tokens / params:.3g} tokens per parameter, the ladder {ratio:.3g}: "
                "a law in C alone cannot say what the ratio changes"
            )
    shares = [r.warmup_share for r in rungs if r.warmup_share is not None]
    warmup = Value(float(np.median(shares)) * tokens, (min(shares) * tokens, max(shares) * tokens)) if shares else None
    eta = by_name["lr_opt"].exponents.get("B")
    chosen = dict(tokens_per_update=by_name["b_opt"].prediction, lr=by_name["lr_opt"].prediction)
    if found is not None:
        point = found.tolerance_point
        chosen = dict(
            tokens_per_update=point.tokens_per_update,
            lr=point.lr,
            loss_optimal=found.loss_optimal,
            predicted_loss_penalty=point.predicted_loss_penalty,
            steps_saved=point.steps_saved,
            point=tradeoff.point_words(tolerance),
        )
        if point.beyond:
            warnings.append(
                f"the predicted penalty stays within {tolerance:.2%} up to {2**tradeoff.SPAN}x B*, beyond what the "
                "rungs measured: the tolerance point is that bound"
            )
    elif any(law.name == "b_star" for law in laws):
        warnings.append("no trade-off at the target: the laws of B* and its penalties are not all fitted")
    return Recommendation(
        params=params,
        tokens=tokens,
        b_crit=by_name["b_crit"].prediction,
        lr_batch_exponent=eta.value if eta else None,
        warmup_tokens=warmup,
        optimizer={k: _held(rungs, k) for k in OPTIMIZER_KEYS},
        decades=decades,
        warnings=tuple(warnings),
        tolerance=tolerance,
        **chosen,
    )


def _held(rungs: Sequence[Rung], key: str) -> Optional[float]:
    """The value every rung held for an optimizer constant in token units, else None."""
    values = {v for r in rungs for v in r.optimizer.get(key, ())}
    complete = all(r.optimizer.get(key) for r in rungs)
    return float(values.pop()) if complete and len(values) == 1 else None


def fitted_at(ladder: Ladder, name: str, params: Optional[float], tokens: float) -> Optional[Value]:
    """The law `name`'s value, with its 90% interval, at (N, D); a law with a B term read at the
    B_opt law's prediction there (their resamples paired), as at the target. None: not fitted."""
    law = ladder.law(name)
    if law.fit is None:
        return None
    b_opt = ladder.law("b_opt").fit if "B" in law.fit.design.variables else None
    at_b_opt = b_opt.prediction(params or 1.0, tokens) if b_opt is not None else ()
    value, draws = law.fit.prediction(params or 1.0, tokens, *at_b_opt)
    return Value(value, ladder_laws.interval_of(draws))


def along(ladder: Ladder, name: str, steps: int = 40) -> List[Tuple[Optional[float], float, Value]]:
    """(N, D, fitted_at) at `steps` points on a straight line in log N and log D from the
    smallest-compute rung to the target (without one, the largest rung): what its figure draws.
    [] when the law is not fitted."""
    if ladder.law(name).fit is None:
        return []
    first, last, rec = ladder.rungs[0], ladder.rungs[-1], ladder.recommendation
    start = np.log([first.params or 1.0, first.tokens])
    end = np.log([rec.params, rec.tokens] if rec else [last.params or 1.0, last.tokens])
    out = []
    for share in np.linspace(0.0, 1.0, steps):
        n, d = (float(x) for x in np.exp(start + share * (end - start)))
        out.append((n if first.params else None, d, fitted_at(ladder, name, n, d)))
    return out


# ---------------------------------------------------------------- output


def to_json(ladder: Ladder) -> Dict[str, Any]:
    """report.json's `ladder` (its keys: docs/ladders.md)."""
    return {
        "tolerance": ladder.tolerance,
        "design": {"variables": list(ladder.design.variables), "note": ladder.design.note},
        "bootstrap": {"resamples": ladder.resamples, "seed": ladder.seed, "level": 0.9},
        "rungs": [r.to_json() for r in ladder.rungs],
        "laws": [law.to_json() for law in ladder.laws],
        "recommendation": ladder.recommendation.to_json() if ladder.recommendation else None,
        "tradeoff": [row.to_json() for row in ladder.tradeoff.rows] if ladder.tradeoff else [],
    }


def lines(ladder: Ladder) -> List[str]:
    """The ladder's answer in a few plain lines (90% intervals in brackets)."""
    out = [
        f"Ladder of {len(ladder.rungs)} rungs; tolerance {ladder.tolerance:.2%} of the loss: the largest batch within "
        "it of the loss-optimal batch B*'s (B_opt: of the best batch size's, where a rung has no B*)."
    ]
    if ladder.design.note:
        out.append(ladder.design.note)
    for law in ladder.laws:
        if law.status != "fitted":
            out.append(f"{law.form} ({'; '.join(law.notes)})")
            continue
        terms = ", ".join(f"{k} {with_interval(v, '+.3f')}" for k, v in law.exponents.items())
        test = law.backtest
        if test is None:
            held = "no backtest"
        elif test.held is None:
            held = f"backtest {test.note}" if test.untested else "no backtest"
        else:
            held = "backtest held" if test.held else "BACKTEST MISSED"
        shape = f"exponents {terms}" if terms else f"value {with_interval(law.prefactor, '.3g')}"
        out.append(f"{law.form}: {shape}; {law.rungs} rungs; {held}")
    rec = ladder.recommendation
    if rec:
        out.append(
            f"For N = {rec.params:.3g}, D = {rec.tokens:.3g} ({rec.decades:.1f} decades of compute beyond the "
            f"largest rung): tokens per update {with_interval(rec.tokens_per_update, ',.0f')} "
            f"(B_crit {with_interval(rec.b_crit, ',.0f')}), peak lr {with_interval(rec.lr, '.3g')}, "
            f"warmup {with_interval(rec.warmup_tokens, ',.0f')} tokens"
        )
        if ladder.tradeoff:
            out += tradeoff.words(ladder.tradeoff)
        else:
            out.append(f"Tokens per update: {rec.point}.")
        held = {k: v for k, v in rec.optimizer.items() if v is not None}
        out.append(
            "Optimizer constants held: " + (", ".join(f"{k} = {v:g}" for k, v in held.items()) or "none in token units")
        )
        out += [f"Warning: {w}" for w in rec.warnings]
    return out


def with_interval(v: Optional[Value], fmt: str) -> str:
    if v is None or v.value is None:
        return "none"
    if not v.interval:
        return format(v.value, fmt)
    return f"{format(v.value, fmt)} [{format(v.interval[0], fmt)}, {format(v.interval[1], fmt)}]"
