"""The loss curves of a training parity run as a PNG."""
from __future__ import annotations

import math
from pathlib import Path

# Figure renders with Agg by itself: no pyplot, no display needed.
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def plot_loss_curves(losses: dict[str, list[float]], rel_diff: list[float], path: Path,
                     title: str) -> None:
    """Top: total loss per iteration, one line per op.  Bottom: their
    relative difference (log scale; iterations with none, or an infinite
    one, are left out)."""
    fig = Figure(figsize=(8, 7))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    for op, curve in losses.items():
        top.plot(range(1, len(curve) + 1), curve, label=op, marker=".")
    top.set_ylabel("total loss")
    top.set_title(title)
    top.legend()
    top.grid(alpha=0.3)
    shown = [(i, d) for i, d in enumerate(rel_diff, start=1) if d > 0 and math.isfinite(d)]
    # Markers only: an iteration left out is no point to draw a line through.
    bottom.plot([i for i, _ in shown], [d for _, d in shown], "o", markersize=3, color="C3")
    if shown:
        bottom.set_yscale("log")
    elif all(d == 0 for d in rel_diff):
        bottom.text(0.5, 0.5, "the same total loss at every iteration", ha="center",
                    va="center", transform=bottom.transAxes)
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_ylabel("relative difference")
    bottom.set_xlabel("iteration")
    bottom.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
