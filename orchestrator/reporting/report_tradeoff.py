"""The trade-off's part of a report (analysis/tradeoff.py): its figure, `tradeoff.png`, and its
blocks near the top of the summary, for a single sweep (its own loss surface) and for a ladder's
target alike."""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from orchestrator.analysis import tradeoff
from orchestrator.reporting.report_format import TOK, G, S, table

FIGURE = "tradeoff.png"
CURVE_POINTS = 60
COLUMNS = [
    ("tokens per update", "tokens_per_update", TOK),
    ("B / B*", "ratio", "{:.2f}"),
    ("lr", "lr", G),
    ("predicted penalty", "penalty", S),
    ("90% interval", "interval", S),
    ("optimizer steps", "steps", "{:,.0f}"),
]

Evidence = Sequence[Tuple[str, Sequence[Tuple[float, float]]]]
"""(label, [(batch rescaled to the trade-off's B*, measured penalty)]) per rung or sweep."""


def figure(t: tradeoff.Tradeoff, evidence: Evidence, title: str):
    from orchestrator.reporting import plots

    low, high = t.rows[0].tokens_per_update, t.rows[-1].tokens_per_update
    batches = np.geomspace(low, high, CURVE_POINTS)
    curve = []
    for b in batches:
        value, draws = t.curve.penalty(float(b))
        finite = draws[np.isfinite(draws)]
        band = (float(np.percentile(finite, 5)), float(np.percentile(finite, 95))) if len(finite) else None
        curve.append((float(b), value, band))
    o, p = t.loss_optimal, t.tolerance_point
    return plots.tradeoff(
        curve,
        [(float(b), t.tokens / float(b)) for b in batches],
        (o.tokens_per_update.value, o.lr.value if o.lr else None),
        (p.tokens_per_update.value, p.predicted_loss_penalty.value, p.lr.value if p.lr else None),
        t.tolerance,
        evidence,
        title,
    )


def blocks(t: tradeoff.Tradeoff, heading: str) -> List[tuple]:
    """The figure and the table of the trade-off (its two points are in the words above it)."""
    rows = [
        {
            "tokens_per_update": r.tokens_per_update,
            "ratio": r.tokens_per_update / t.loss_optimal.tokens_per_update.value,
            "lr": r.lr,
            "penalty": f"{r.predicted_loss_penalty:+.2%}",
            "interval": f"{r.interval[0]:+.2%} - {r.interval[1]:+.2%}" if r.interval else "-",
            "steps": r.steps,
        }
        for r in t.rows
    ]
    explain = (
        "The loss at each batch size (at its lr) as a share above the loss-optimal batch B*'s, against the "
        "optimizer steps the budget takes: a larger batch saves steps and costs loss. The points are the measured "
        "penalties of the runs, each rescaled by its own B* (docs/critical-batch.md#two-points-one-choice)."
    )
    return [
        ("h2", heading),
        ("p", explain),
        ("img", FIGURE),
        table(rows, COLUMNS),
    ]
