"""Loss curves of runs compared (parity runs, training runs) as a PNG."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

# Figure renders with Agg by itself: no pyplot, no display needed.
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

Series = tuple[Sequence[float], Sequence[float]]  # (iterations, values)


def plot_loss_curves(losses: dict[str, Series], rel_diff: dict[str, Series], path: Path,
                     title: str) -> None:
    """Top: total loss against iteration, one line per run.  Bottom: each
    series of ``rel_diff`` (a run's relative difference to a baseline; log
    scale of its magnitude; zero or infinite points are left out)."""
    fig = Figure(figsize=(8, 7))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    for name, (x, y) in losses.items():
        top.plot(x, y, label=name, marker="." if len(x) <= 200 else None)
    top.set_ylabel("total loss")
    top.set_title(title)
    top.legend()
    top.grid(alpha=0.3)
    drawn = 0
    for colour, (name, (x, d)) in enumerate(rel_diff.items(), start=3):
        shown = [(i, abs(v)) for i, v in zip(x, d) if v and math.isfinite(v)]
        # Markers only: a point left out is no point to draw a line through.
        bottom.plot([i for i, _ in shown], [v for _, v in shown], "o", markersize=3,
                    color=f"C{colour}", label=name)
        drawn += len(shown)
    if drawn:
        bottom.set_yscale("log")
        if len(rel_diff) > 1:
            bottom.legend()
    elif all(v == 0 for _, d in rel_diff.values() for v in d):
        bottom.text(0.5, 0.5, "the same total loss at every iteration", ha="center",
                    va="center", transform=bottom.transAxes)
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_ylabel("|relative difference|")
    bottom.set_xlabel("iteration")
    bottom.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
