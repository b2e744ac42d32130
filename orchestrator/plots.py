"""Matplotlib figures shared by runs, sweeps and reports (headless: Agg backend)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

Curve = List[Tuple[float, float]]


def loss_vs_tokens(curves: Dict[str, Curve], title: str = "", colors: Optional[Sequence] = None,
                   xlabel: str = "tokens seen", ylabel: str = "loss"):
    """One line per labelled curve of (x, loss) points."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (label, points) in enumerate(curves.items()):
        if not points:
            continue
        xs, ys = zip(*points)
        ax.plot(xs, ys, label=label, color=colors[i] if colors else None, lw=1.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(curves) <= 16:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
