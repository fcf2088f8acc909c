"""Compare finished (or cut-short) training runs from their mmengine work_dirs.

    python tools/compare_runs.py NAME=WORK_DIR [NAME=WORK_DIR ...] --out DIR
        [--window 50] [--title TEXT]

The first run is the baseline.  Prints, per run, the last logged iteration, the
median seconds per iteration, the peak memory, the windowed mean loss and
the COCO AP of its last evaluation; then, for every other run, its AP
difference (AP points) and the relative difference of its windowed loss to
the baseline's.  Writes DIR/runs.json (all of it, plus the raw loss records)
and DIR/runs_loss.png.  Reads only the logs: no GPU, mmdet or mmengine needed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Runs as `python tools/compare_runs.py` from a checkout: bench/ is never installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def named_dir(text: str) -> tuple[str, Path]:
    """argparse type: NAME=WORK_DIR."""
    name, sep, path = text.partition("=")
    if not (sep and name and path):
        raise argparse.ArgumentTypeError(f"expected NAME=WORK_DIR, got {text!r}")
    return name, Path(path)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=named_dir, metavar="NAME=WORK_DIR",
                        help="runs to compare; the first is the baseline")
    parser.add_argument("--out", type=Path, required=True, help="folder for runs.json/.png")
    parser.add_argument("--window", type=int, default=50, metavar="N",
                        help="iterations per loss window (default 50)")
    parser.add_argument("--title", default="training runs", help="plot title")
    args = parser.parse_args(argv)
    names = [name for name, _ in args.runs]
    if len(set(names)) != len(names):
        parser.error(f"run names must differ, got {names}")
    if args.window < 1:
        parser.error(f"--window must be >= 1, got {args.window}")
    return args


def _row(name: str, run: dict, ap_keys) -> str:
    last = (run["evals"] or [{}])[-1]
    ap = " ".join(f"{last.get(k, float('nan')):5.1f}" for k in ap_keys)
    windows = run["loss_windows"]
    return (f"{name:<16} {run['iters']:>6} {run['s_per_iter']:>8.3f} {run['memory_mib']:>7} "
            f"{windows[-1]['loss']:>9.3f}  {ap}  (epoch {last.get('epoch')})")


def main(argv=None) -> int:
    args = parse_args(argv)
    # Here, after the command line is read.
    from bench.step.plot import plot_loss_curves
    from bench.step.runs import COCO_KEYS, compare, summarize

    try:
        runs = {name: summarize(path, args.window) for name, path in args.runs}
    except (OSError, ValueError) as error:
        raise SystemExit(f"compare_runs.py: {error}") from None
    (base_name, base), *others = runs.items()
    comparisons = {name: compare(run, base) for name, run in others}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runs.json").write_text(json.dumps(
        dict(window=args.window, baseline=base_name, runs=runs,
             vs_baseline=comparisons), indent=1) + "\n")
    plot_loss_curves(
        {name: ([r[0] for r in run["loss_records"]], [r[1] for r in run["loss_records"]])
         for name, run in runs.items()},
        {name: ([w["iters"][1] for w in c["loss_rel_diff"]],
                [w["rel_diff"] for w in c["loss_rel_diff"]]) for name, c in comparisons.items()},
        base_name, args.out / "runs_loss.png", args.title)

    # iters: the last logged iteration (mmengine logs every logger.interval).
    print(f"{'run':<16} {'iters':>6} {'s/iter':>8} {'MiB':>7} {'last loss':>9}  "
          f"{'AP':>5} {'AP50':>5}  (iters: last logged; loss: last {args.window}-iteration "
          "window)")
    for name, run in runs.items():
        print(_row(name, run, COCO_KEYS[:2]))
    for name, c in comparisons.items():
        worst = c["max_abs_loss_rel_diff"]
        print(f"{name} vs {base_name}: AP delta {c['ap_delta'].get('bbox_mAP')} points, "
              f"AP50 delta {c['ap_delta'].get('bbox_mAP_50')}; windowed loss differs by at most "
              f"{'n/a' if worst is None else f'{100 * worst:.1f}%'}")
    print(f"Written: {args.out / 'runs.json'}, {args.out / 'runs_loss.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
