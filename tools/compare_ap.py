"""Does a recipe score as another does?  Two groups of training runs (seeds),
their COCO AP at one epoch, compared by rank statistics.

    python tools/compare_ap.py BASELINE=PATH[,PATH ...] CANDIDATE=PATH[,PATH ...]
        [--metric bbox_mAP] [--epoch N] [--level 0.9] [--paired] [--out FILE]

A PATH is an mmengine work_dir, one of its scalars.json files, or the
runs.json that tools/compare_runs.py writes (each of its runs).  Prints each
run's AP at --epoch (default: the last epoch any run evaluated; a run
without that evaluation is refused by name), each group's mean and range,
and the candidate against the baseline: the Hodges-Lehmann shift in AP
points with its distribution-free interval and that interval's exact
coverage, Mann-Whitney's U and its one-sided p-value that the candidate
scores lower (exact over every split of the pooled runs, ties included;
bench/step/ap_stats.py).  With --paired the i-th run of each group are a
pair (the same seed: initial weights and data): their differences, the
paired Hodges-Lehmann shift with its interval and Wilcoxon's signed-rank
one-sided p-value, exact over every sign assignment; pairing takes what a
seed does to both runs (a bad start, say) out of the comparison.  With
--out, all of it as JSON.  Reads only the logs: no GPU, mmdet or mmengine
needed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

# Runs as `python tools/compare_ap.py` from a checkout: bench/ is never installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def group(text: str) -> tuple[str, list[Path]]:
    """argparse type: NAME=PATH[,PATH ...]."""
    name, sep, paths = text.partition("=")
    if not (sep and name and paths) or not all(paths.split(",")):
        raise argparse.ArgumentTypeError(f"expected NAME=PATH[,PATH ...], got {text!r}")
    return name, [Path(p) for p in paths.split(",")]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("baseline", type=group, metavar="BASELINE=PATH[,PATH ...]",
                        help="the reference recipe's runs")
    parser.add_argument("candidate", type=group, metavar="CANDIDATE=PATH[,PATH ...]",
                        help="the runs compared with them")
    parser.add_argument("--metric", default="bbox_mAP",
                        help="CocoMetric key, in AP points (default bbox_mAP)")
    parser.add_argument("--epoch", type=int, metavar="N",
                        help="the evaluation compared (default: the last any run has)")
    parser.add_argument("--level", type=float, default=0.9,
                        help="the shift interval's coverage at least (default 0.9)")
    parser.add_argument("--paired", action="store_true",
                        help="the i-th runs of the two groups share a seed: compare them "
                             "pair by pair too (the groups' runs in the order given)")
    parser.add_argument("--out", type=Path, metavar="FILE", help="write the comparison as JSON")
    args = parser.parse_args(argv)
    if args.baseline[0] == args.candidate[0]:
        parser.error(f"the two groups need two names, got {args.baseline[0]!r} twice")
    if not 0 < args.level < 1:
        parser.error(f"--level must be in (0, 1), got {args.level}")
    return args


def run_evals(path: Path) -> dict[str, list[dict]]:
    """Each run's evaluations (AP points) at ``path``, by run name: a
    work_dir or a scalars.json is one run (named by its path), a
    compare_runs.py runs.json is all of its."""
    from bench.step.runs import evals_in_points, read_records, read_run, scalars_files

    if path.is_dir():
        return {str(path): evals_in_points(read_run(scalars_files(path))[1])}
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such work_dir or file")
    if path.name == "runs.json":
        runs = json.loads(path.read_text()).get("runs")
        if not isinstance(runs, dict):
            raise ValueError(f"{path}: not a runs.json of tools/compare_runs.py (no 'runs')")
        return {f"{path}:{name}": run["evals"] for name, run in runs.items()}
    return {str(path): evals_in_points(read_records(path)[1])}


def scores(paths: list[Path], metric: str) -> dict[str, dict[int, float]]:
    """Per run of ``paths``: {epoch: the metric at that evaluation}."""
    runs = {}
    for path in paths:
        for name, evals in run_evals(path).items():
            runs[name] = {e["epoch"]: e[metric] for e in evals if metric in e}
    return runs


def at_epoch(runs: dict[str, dict[int, float]], epoch: int) -> dict[str, float]:
    missing = {name: max(by_epoch, default=None) for name, by_epoch in runs.items()
               if epoch not in by_epoch}
    if missing:
        raise ValueError("no evaluation at epoch {} in {} (last: {}): leave them out or "
                         "pass --epoch".format(epoch, ", ".join(missing),
                                               ", ".join(map(str, missing.values()))))
    return {name: by_epoch[epoch] for name, by_epoch in runs.items()}


def paired(base: list[float], cand: list[float], level: float) -> dict:
    """The paired comparison of ``cand`` with ``base``, run i with run i."""
    from bench.step.ap_stats import paired_p_lower, paired_shift_interval, signed_rank

    differences = [c - b for b, c in zip(base, cand)]
    w_plus, ranks = signed_rank(differences)
    p, method = paired_p_lower(differences)
    return dict(differences=differences, w_plus=w_plus, w_max=sum(ranks),
                p_candidate_lower=p, p_method=method,
                shift=paired_shift_interval(differences, level))


def main(argv=None) -> int:
    args = parse_args(argv)
    from bench.step.ap_stats import mann_whitney_u, p_lower, shift_interval

    (base_name, base_paths), (cand_name, cand_paths) = args.baseline, args.candidate
    try:
        runs = {base_name: scores(base_paths, args.metric),
                cand_name: scores(cand_paths, args.metric)}
        epoch = args.epoch if args.epoch is not None else max(
            (e for group_runs in runs.values() for by_epoch in group_runs.values()
             for e in by_epoch), default=None)
        if epoch is None:
            raise ValueError(f"no run has an evaluation of {args.metric}")
        values = {name: at_epoch(group_runs, epoch) for name, group_runs in runs.items()}
        if args.paired and len(values[base_name]) != len(values[cand_name]):
            raise ValueError(f"--paired needs as many {cand_name} runs as {base_name} runs, "
                             f"got {len(values[cand_name])} and {len(values[base_name])}")
    except (OSError, ValueError) as error:
        raise SystemExit(f"compare_ap.py: {error}") from None
    base, cand = list(values[base_name].values()), list(values[cand_name].values())
    p, method = p_lower(base, cand)
    report = dict(metric=args.metric, epoch=epoch, runs=values,
                  means={name: statistics.fmean(v.values()) for name, v in values.items()},
                  u=mann_whitney_u(base, cand), pairs=len(base) * len(cand),
                  p_candidate_lower=p, p_method=method,
                  shift=shift_interval(base, cand, args.level))
    print(f"{args.metric} at epoch {epoch}, AP points")
    for name, group_values in values.items():
        listed = " ".join(f"{v:.1f}" for v in group_values.values())
        print(f"{name}: {listed}  (mean {report['means'][name]:.2f}, "
              f"{min(group_values.values()):.1f}-{max(group_values.values()):.1f})")
    s = report["shift"]
    print(f"{cand_name} against {base_name}: shift {s['shift']:+.2f} AP, interval "
          f"[{s['low']:+.2f}, {s['high']:+.2f}] (coverage {s['coverage']:.3f}); "
          f"U = {report['u']:g} of {report['pairs']}, one-sided p = {p:.4f} ({method}) "
          f"that {cand_name} scores lower")
    if args.paired:
        report["paired"] = paired(base, cand, args.level)
        q = report["paired"]
        print("paired, the i-th run with the i-th: differences "
              + " ".join(f"{d:+.1f}" for d in q["differences"])
              + f"; shift {q['shift']['shift']:+.2f} AP, interval [{q['shift']['low']:+.2f}, "
              f"{q['shift']['high']:+.2f}] (coverage {q['shift']['coverage']:.3f}); W+ = "
              f"{q['w_plus']:g} of {q['w_max']:g}, one-sided p = {q['p_candidate_lower']:.4f} "
              f"({q['p_method']}) that {cand_name} scores lower")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
