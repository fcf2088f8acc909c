"""Loss curves of runs compared (parity runs, training runs) as a PNG."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

Series = tuple[Sequence[float], Sequence[float]]  # (iterations, values)
_OUTSIDE = dict(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")


def plot_loss_curves(losses: dict[str, Series], rel_diff: dict[str, Series], baseline: str,
                     path: Path, title: str) -> None:
    """Top: total loss against iteration, one line per run of ``losses``.
    Bottom: for each run named in ``rel_diff``, its relative difference to
    the run ``baseline``, in the run's colour (log scale of the magnitude;
    zero or infinite points are left out).  Legends sit right of the axes,
    off the curves; past 10 runs the colours come from tab20, so none repeat
    up to 20."""
    # Here: matplotlib (msda_mm's "bench" extra) loads only when a plot is
    # made.  Figure renders with Agg by itself: no pyplot, no display needed.
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(11, 7))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    palette = colormaps["tab10" if len(losses) <= 10 else "tab20"]
    colours = {name: palette(i % palette.N) for i, name in enumerate(losses)}
    for name, (x, y) in losses.items():
        top.plot(x, y, label=name, color=colours[name], marker="." if len(x) <= 200 else None)
    top.set_ylabel("total loss")
    top.set_title(title)
    top.legend(**_OUTSIDE)
    top.grid(alpha=0.3)
    drawn = 0
    for name, (x, d) in rel_diff.items():
        shown = [(i, abs(v)) for i, v in zip(x, d) if v and math.isfinite(v)]
        # Markers only: a point left out is no point to draw a line through.
        bottom.plot([i for i, _ in shown], [v for _, v in shown], "o", markersize=3,
                    color=colours[name], label=f"{name} vs {baseline}")
        drawn += len(shown)
    if drawn:
        bottom.set_yscale("log")
        bottom.legend(**_OUTSIDE)
    elif rel_diff and all(v == 0 for _, d in rel_diff.values() for v in d):
        bottom.text(0.5, 0.5, "the same total loss at every iteration", ha="center",
                    va="center", transform=bottom.transAxes)
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_ylabel("|relative difference|")
    bottom.set_xlabel("iteration")
    bottom.grid(alpha=0.3, which="both")
    fig.savefig(path, dpi=100, bbox_inches="tight")
