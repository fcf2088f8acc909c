"""Training runs read back from their mmengine work_dirs and compared: loss
curves in windows of iterations, seconds per iteration, COCO metrics.

mmengine writes ``<work_dir>/<timestamp>/vis_data/scalars.json``: one JSON
object per line, a training record every ``logger.interval`` iterations
(``loss`` is the mean over that interval, ``iter``, ``time``, ``memory``) and
an evaluation record after each validation (``coco/bbox_mAP`` ... as
fractions, ``step``: the epoch).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

# mmdet's CocoMetric keys, reported in AP points (x 100) as papers quote them.
COCO_KEYS = ("bbox_mAP", "bbox_mAP_50", "bbox_mAP_75", "bbox_mAP_s", "bbox_mAP_m", "bbox_mAP_l")


def scalars_files(work_dir: Path) -> list[Path]:
    """Every run's scalars.json under ``work_dir``, oldest first (timestamps
    sort as text; a resumed run writes a new one)."""
    files = sorted(Path(work_dir).glob("*/vis_data/scalars.json"))
    if not files:
        raise FileNotFoundError(f"no */vis_data/scalars.json under {work_dir}: not an "
                                "mmengine work_dir, or the run logged nothing")
    return files


def read_records(path: Path) -> tuple[list[dict], list[dict]]:
    """(training records, evaluation records) of one scalars.json."""
    train, evals = [], []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if "loss" in record and "iter" in record:
            train.append(record)
        elif any(k.startswith("coco/") for k in record):
            evals.append(record)
    return train, evals


def read_run(paths: list[Path]) -> tuple[list[dict], list[dict]]:
    """The records of a run logged over ``paths`` (oldest first: a run and
    its resumptions).  A resumed run starts again from its last checkpoint,
    so where files overlap the later one's records replace the earlier's:
    training records from its first iteration on, evaluations by step."""
    train: list[dict] = []
    evals: dict = {}
    for path in paths:
        later_train, later_evals = read_records(path)
        if later_train:
            train = [r for r in train if r["iter"] < later_train[0]["iter"]] + later_train
        evals.update((r.get("step"), r) for r in later_evals)
    return train, sorted(evals.values(), key=lambda r: r.get("step") or 0)


def window_means(train: list[dict], window: int) -> list[dict]:
    """Mean logged loss per window of ``window`` iterations: the records
    with iter in (k * window, (k + 1) * window], for each k that has one."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    groups: dict[int, list[float]] = {}
    for record in train:
        groups.setdefault((record["iter"] - 1) // window, []).append(record["loss"])
    return [dict(iters=[k * window + 1, (k + 1) * window], loss=statistics.fmean(losses))
            for k, losses in sorted(groups.items())]


def summarize(work_dir: Path, window: int) -> dict:
    """One run (with its resumptions): the last logged iteration, median
    seconds per iteration (the first record, with start-up, left out), peak
    memory (MiB), the windowed loss curve, the raw loss records and every
    evaluation in AP points."""
    paths = scalars_files(work_dir)
    train, evals = read_run(paths)
    if not train:
        raise ValueError(f"{work_dir}: its scalars.json files have no training records")
    times = [r["time"] for r in train[1:] if "time" in r] or [train[0].get("time", float("nan"))]
    return dict(
        scalars=[str(p) for p in paths],
        iters=train[-1]["iter"],
        s_per_iter=statistics.median(times),
        memory_mib=max(r.get("memory", 0) for r in train),
        loss_windows=window_means(train, window),
        loss_records=[[r["iter"], r["loss"]] for r in train],
        evals=evals_in_points(evals),
    )


def evals_in_points(evals: list[dict]) -> list[dict]:
    """Evaluation records as {epoch, metric: AP points} (one decimal)."""
    # CocoMetric writes -1 for an area range with no ground truth: left out.
    return [dict(epoch=r.get("step"), **{k: round(100.0 * r[f"coco/{k}"], 1) for k in COCO_KEYS
                                         if r.get(f"coco/{k}", -1) >= 0})
            for r in evals]


def compare(run: dict, baseline: dict) -> dict:
    """``run`` against ``baseline``: the relative difference of their
    windowed losses over the windows both have, and the AP-point difference
    of each metric at their last evaluations."""
    base = {tuple(w["iters"]): w["loss"] for w in baseline["loss_windows"]}
    rel = [dict(iters=w["iters"], rel_diff=(w["loss"] - base[tuple(w["iters"])])
                / base[tuple(w["iters"])])
           for w in run["loss_windows"] if base.get(tuple(w["iters"]))]
    last, base_last = (run["evals"] or [{}])[-1], (baseline["evals"] or [{}])[-1]
    return dict(
        loss_rel_diff=rel,
        max_abs_loss_rel_diff=max((abs(r["rel_diff"]) for r in rel), default=None),
        ap_delta={k: round(last[k] - base_last[k], 1) for k in COCO_KEYS
                  if k in last and k in base_last},
        epochs=[last.get("epoch"), base_last.get("epoch")],
    )
