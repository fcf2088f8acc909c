"""tools/compare_runs.py and bench/step/runs.py on hand-written mmengine
scalars.json files: windowed losses, timing, AP points, the comparison
against the baseline, and the errors for bad input."""
import json
import subprocess
import sys

import pytest
from tool_runs import ROOT, write_run

from bench.step.runs import compare, summarize, window_means


def test_window_means_group_by_iteration():
    train = [dict(iter=i, loss=float(i)) for i in (10, 20, 30, 40, 60)]
    assert window_means(train, 20) == [dict(iters=[1, 20], loss=15.0),
                                       dict(iters=[21, 40], loss=35.0),
                                       dict(iters=[41, 60], loss=60.0)]
    with pytest.raises(ValueError, match="window"):
        window_means(train, 0)


def test_summary_of_a_run(tmp_path):
    write_run(tmp_path, {10: 4.0, 20: 2.0, 30: 3.0}, {1: 0.1234, 2: 0.25})
    run = summarize(tmp_path, window=20)
    assert run["scalars"] == [str(tmp_path / "20261129_120000/vis_data/scalars.json")]
    assert run["iters"] == 30 and run["s_per_iter"] == 0.5 and run["memory_mib"] == 130
    assert run["loss_windows"] == [dict(iters=[1, 20], loss=3.0), dict(iters=[21, 40], loss=3.0)]
    # AP points, rounded as CocoMetric's 3 decimals; the -1 of an empty area range left out.
    assert run["evals"] == [dict(epoch=1, bbox_mAP=12.3, bbox_mAP_50=24.7),
                            dict(epoch=2, bbox_mAP=25.0, bbox_mAP_50=50.0)]


def test_a_resumed_run_is_read_whole(tmp_path):
    # Stopped after iteration 30 (evaluated after epoch 1), resumed from the
    # checkpoint at 20: the later file's records replace the earlier's from
    # its first iteration on, and its evaluation of epoch 1 the earlier one.
    write_run(tmp_path, {10: 4.0, 20: 2.0, 30: 9.0}, {1: 0.1}, timestamp="20261129_110000")
    write_run(tmp_path, {30: 3.0, 40: 1.0}, {1: 0.2, 2: 0.3}, timestamp="20261129_120000")
    run = summarize(tmp_path, window=20)
    assert len(run["scalars"]) == 2
    assert run["loss_records"] == [[10, 4.0], [20, 2.0], [30, 3.0], [40, 1.0]]
    assert [(e["epoch"], e["bbox_mAP"]) for e in run["evals"]] == [(1, 20.0), (2, 30.0)]


def test_compare_against_baseline(tmp_path):
    base = summarize(write_run(tmp_path / "a", {10: 2.0, 20: 4.0}, {1: 0.30}), window=10)
    run = summarize(write_run(tmp_path / "b", {10: 3.0, 20: 3.0, 30: 1.0}, {1: 0.25}), window=10)
    result = compare(run, base)
    assert result["loss_rel_diff"] == [dict(iters=[1, 10], rel_diff=0.5),
                                       dict(iters=[11, 20], rel_diff=-0.25)]
    assert result["max_abs_loss_rel_diff"] == 0.5
    assert result["ap_delta"] == dict(bbox_mAP=-5.0, bbox_mAP_50=-10.0)


def _tool(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "compare_runs.py"), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_tool_writes_json_and_plot(tmp_path):
    a = write_run(tmp_path / "a", {10: 2.0, 20: 4.0}, {1: 0.30})
    b = write_run(tmp_path / "b", {10: 3.0, 20: 3.0}, {1: 0.25})
    result = _tool(f"fp32={a}", f"bf16={b}", "--out", str(tmp_path / "out"), "--window", "10")
    assert result.returncode == 0, result.stderr
    assert "bf16 vs fp32: AP delta -5.0 points" in result.stdout
    assert "at most 50.0%" in result.stdout
    report = json.loads((tmp_path / "out" / "runs.json").read_text())
    assert report["baseline"] == "fp32" and set(report["runs"]) == {"fp32", "bf16"}
    assert (tmp_path / "out" / "runs_loss.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args, message", [
    (["nodir"], "expected NAME=WORK_DIR"),
    (["a=x", "a=y"], "run names must differ"),
    (["a=x", "--window", "0"], "--window must be >= 1"),
    (["a=missing_dir"], "no */vis_data/scalars.json under missing_dir"),
])
def test_bad_input_is_named(args, message, tmp_path):
    result = _tool(*args, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr
