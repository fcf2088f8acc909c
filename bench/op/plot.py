"""Bar chart of forward and backward device times."""
from __future__ import annotations

from pathlib import Path

_PANELS = (("fwd_us", "forward"), ("bwd_us", "backward"))


def plot_times(records: list[dict], path: Path, title: str) -> None:
    """Two log-scale panels (forward, backward device time); one group of bars
    per preset/dist/dtype, one bar per implementation."""
    # Here: matplotlib (msda_mm's "bench" extra) loads only when a plot is
    # made.  Figure renders with Agg by itself: no pyplot, no display needed.
    from matplotlib.figure import Figure

    groups = list(dict.fromkeys((r["preset"], r["dist"], r["dtype"]) for r in records))
    # Only implementations that ran somewhere (mmcv is often n/a throughout).
    impls = list(dict.fromkeys(r["impl"] for r in records if r.get("fwd_us") is not None))
    by_cell = {(r["preset"], r["dist"], r["dtype"], r["impl"]): r for r in records}
    width = 0.8 / max(1, len(impls))
    fig = Figure(figsize=(max(8.0, 0.2 + 0.35 * len(groups) * len(impls)), 9))
    axes = fig.subplots(2, 1, sharex=True)
    for ax, (field, label) in zip(axes, _PANELS):
        for i, impl in enumerate(impls):
            bars = [(g, by_cell.get((*group, impl), {}).get(field))
                    for g, group in enumerate(groups)]
            # A backward within noise of zero (or an n/a cell) has no bar.
            bars = [(g, t) for g, t in bars if isinstance(t, float) and t > 0]
            ax.bar([g + (i - (len(impls) - 1) / 2) * width for g, _ in bars],
                   [t for _, t in bars], width, label=impl, color=f"C{i}")
        ax.set_yscale("log")
        ax.set_ylabel(f"{label} device time (us)")
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0].set_title(title)
    axes[0].legend()
    axes[1].set_xticks(range(len(groups)), ["/".join(g) for g in groups], rotation=90)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
