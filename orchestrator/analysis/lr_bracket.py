"""Bracketing the best learning rate of one batch size (and group of the other grid axes): the
state machine behind `search.algorithm: bracket` (orchestrator/studies/bracket_search.py is its Ray
Tune Searcher). Pure: no Ray.

A Bracket hands out (lr, seed index) trials one round at a time and, when every trial of the
round has a result, decides the next round from the mean score over seeds of each lr (a failed,
diverged, non-finite or early-stopped trial scores +inf):

    extend    the best lr is the lowest tried: propose lowest / step; the highest: highest x step
              (under every criterion in use; with `both`, one of each may come in one round);
    refine    once interior under every criterion: the vertex of a parabola in log lr through the
              best and its two neighbours, per criterion, unless within step^(1/4) of a tried lr
              (a neighbour that scored +inf: the log midpoint towards it instead);
    done      after the refinement round, or when nothing is left to refine, or when
              max_lrs lrs are tried (at an edge: `why` says so, and the analysis flags the edge);
              with `refine` off, as soon as the best is interior (a placed ladder's rungs at a fine
              lr step: the analysis reads the same parabola's vertex, and the laws pool the rungs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

CRITERIA = ("final_loss", "stable_loss", "steps", "both")
RESULT_KEYS = {"final_loss": "eval_loss", "stable_loss": "stable_loss", "steps": "steps_to_target"}
"""What each criterion reads from a trial's last Ray result (steps_to_target: added by the
searcher from the trial's MLflow run, orchestrator/studies/bracket_search.py)."""


def criteria_of(criterion: str) -> Tuple[str, ...]:
    """`both` -> (final_loss, steps): the two that can disagree; the others -> themselves."""
    if criterion not in CRITERIA:
        raise ValueError(f"criterion {criterion!r}: one of {', '.join(CRITERIA)}")
    return ("final_loss", "steps") if criterion == "both" else (criterion,)


def finite_or_inf(x: Any) -> float:
    """A number as a score: NaN, None or anything not a number is +inf."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return math.inf
    return x if math.isfinite(x) else math.inf


def scores_of(
    result: Optional[Mapping[str, Any]], error: bool, criteria: Sequence[str], budget: Optional[int] = None
) -> Dict[str, float]:
    """A trial's scores from its last result: +inf for every criterion when it failed, diverged
    or stopped before `budget` tokens (early stopping found it worse than its peers); a missing
    or non-finite value is +inf for its criterion."""
    result = result or {}
    short = budget is not None and finite_or_inf(result.get("tokens")) < budget
    if error or not result or result.get("diverged") or "infeasible" in result or short:
        return {c: math.inf for c in criteria}
    return {c: finite_or_inf(result.get(RESULT_KEYS[c])) for c in criteria}


def round_lr(lr: float) -> float:
    return float(f"{lr:.6g}")


@dataclass
class Bracket:
    initial: Sequence[float]
    """The first round's learning rates."""
    seeds: int = 1
    criteria: Tuple[str, ...] = ("final_loss",)
    step: float = 2.0
    max_lrs: int = 7
    refine: bool = True
    """Whether an interior best gets the refinement round."""
    lrs: List[float] = field(default_factory=list)
    """Every lr proposed, in the order proposed."""
    results: Dict[Tuple[float, int], Dict[str, float]] = field(default_factory=dict)
    """(lr, seed index) -> criterion -> score."""
    queue: List[Tuple[float, int]] = field(default_factory=list)
    """Trials of the present round not yet handed out."""
    out: List[Tuple[float, int]] = field(default_factory=list)
    """Trials handed out, waiting for a result."""
    phase: str = "extend"
    """extend, refine or done."""
    why: str = ""
    """Why it is done."""

    def __post_init__(self) -> None:
        self.criteria = tuple(self.criteria)
        if not self.lrs:
            initial = sorted({round_lr(x) for x in self.initial})
            if not initial or initial[0] <= 0 or len(initial) > self.max_lrs:
                raise ValueError(f"initial lrs {list(self.initial)}: 1 to {self.max_lrs} values > 0")
            self._propose(initial)

    # ---------------------------------------------------------------- trials

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def take(self) -> Optional[Tuple[float, int]]:
        """The next trial of the round, (lr, seed index), or None (round handed out, or done)."""
        if not self.queue:
            return None
        trial = self.queue.pop(0)
        self.out.append(trial)
        return trial

    def skip(self, why: str) -> None:
        """Done before any trial ran (a ladder rung's batch size its placement leaves out)."""
        assert not self.out and not self.results, "a bracket whose trials ran is not skipped"
        self.queue.clear()
        self._finish(why)

    def record(self, lr: float, seed: int, scores: Mapping[str, float]) -> None:
        """A trial's scores (missing criteria: +inf); decides the next round when it was the last."""
        key = (round_lr(lr), seed)
        self.results[key] = {c: finite_or_inf(scores.get(c)) for c in self.criteria}
        if key in self.out:
            self.out.remove(key)
        if not self.queue and not self.out and not self.done:
            self._decide()

    def score(self, lr: float, criterion: str) -> float:
        """Mean over seeds; +inf when a seed has no result yet or scored +inf."""
        values = [self.results.get((lr, k), {}).get(criterion, math.inf) for k in range(self.seeds)]
        return sum(values) / len(values)

    def best(self, criterion: str) -> Optional[float]:
        """The lr of lowest score (the lowest lr on a tie); None when every score is +inf."""
        scored = [(self.score(lr, criterion), lr) for lr in self.lrs]
        low = min(scored)
        return low[1] if math.isfinite(low[0]) else None

    # ---------------------------------------------------------------- decisions

    def _propose(self, lrs: Sequence[float]) -> None:
        for lr in lrs:
            self.lrs.append(lr)
            self.queue += [(lr, k) for k in range(self.seeds)]

    def _finish(self, why: str) -> None:
        self.phase, self.why = "done", why

    def _decide(self) -> None:
        if self.phase == "refine":
            return self._finish("interior, refined")
        tried = sorted(self.lrs)
        edges = []
        for c in self.criteria:
            best = self.best(c)
            if best is None or best == tried[0]:  # every lr failed: most likely all too high
                edges.append(round_lr(tried[0] / self.step))
            if best is not None and best == tried[-1]:
                edges.append(round_lr(tried[-1] * self.step))
        if edges:
            new = [x for x in dict.fromkeys(edges) if x not in tried]
            room = self.max_lrs - len(self.lrs)
            if not new or room <= 0:
                side = " and ".join(sorted({"low" if x < tried[0] else "high" for x in edges}))
                return self._finish(f"best at the {side} edge after {len(self.lrs)} lrs (search.max_lrs_per_batch)")
            return self._propose(new[:room])
        if not self.refine:
            return self._finish("interior")
        vertices: List[float] = []
        for c in self.criteria:
            v = self.vertex(c)
            if v is not None and not any(_close(v, x, self.step) for x in tried + vertices):
                vertices.append(v)
        room = self.max_lrs - len(self.lrs)
        if not vertices or room <= 0:
            return self._finish("interior" + ("" if vertices else ", nothing to refine"))
        self.phase = "refine"
        self._propose(vertices[:room])

    def vertex(self, criterion: str) -> Optional[float]:
        """The refinement of an interior best: the vertex of the parabola in log lr through the best
        and its two neighbours (inside them, as the best is lowest); towards a neighbour that scored
        +inf, the log midpoint to it; None at an edge or with both neighbours +inf."""
        tried = sorted(self.lrs)
        best = self.best(criterion)
        if best is None or best in (tried[0], tried[-1]):
            return None
        i = tried.index(best)
        (x0, x1, x2) = (math.log(v) for v in tried[i - 1 : i + 2])
        y0, y1, y2 = (self.score(v, criterion) for v in tried[i - 1 : i + 2])
        if math.isinf(y0) and math.isinf(y2):
            return None
        if math.isinf(y0) or math.isinf(y2):
            return round_lr(math.exp((x1 + (x0 if math.isinf(y0) else x2)) / 2))
        num = (x1 - x0) ** 2 * (y1 - y2) - (x1 - x2) ** 2 * (y1 - y0)
        den = (x1 - x0) * (y1 - y2) - (x1 - x2) * (y1 - y0)
        return round_lr(math.exp(x1 - 0.5 * num / den))

    # ---------------------------------------------------------------- state as JSON

    def to_json(self) -> Dict[str, Any]:
        """Plain JSON (a score of +inf is null)."""
        return {
            "initial": list(self.initial),
            "seeds": self.seeds,
            "criteria": list(self.criteria),
            "step": self.step,
            "max_lrs": self.max_lrs,
            "refine": self.refine,
            "lrs": self.lrs,
            "results": [
                [lr, k, {c: v if math.isfinite(v) else None for c, v in s.items()}]
                for (lr, k), s in self.results.items()
            ],
            "queue": [list(t) for t in self.queue],
            "out": [list(t) for t in self.out],
            "phase": self.phase,
            "why": self.why,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Bracket":
        return cls(
            initial=list(data["initial"]),
            seeds=int(data["seeds"]),
            criteria=tuple(data["criteria"]),
            step=float(data["step"]),
            max_lrs=int(data["max_lrs"]),
            refine=bool(data.get("refine", True)),  # a state saved before the flag: refined
            lrs=[float(x) for x in data["lrs"]],
            results={(float(lr), int(k)): {c: finite_or_inf(v) for c, v in s.items()} for lr, k, s in data["results"]},
            queue=[(float(lr), int(k)) for lr, k in data["queue"]],
            out=[(float(lr), int(k)) for lr, k in data["out"]],
            phase=str(data["phase"]),
            why=str(data["why"]),
        )


def _close(a: float, b: float, step: float) -> bool:
    """Within a factor step^(1/4) of each other."""
    return abs(math.log(a / b)) < math.log(step) / 4


def initial_from_rule(guess: float, step: float) -> List[float]:
    """An lr_scaling rule's guess at one batch size -> guess / step, guess, guess x step."""
    return [round_lr(guess / step), round_lr(guess), round_lr(guess * step)]
