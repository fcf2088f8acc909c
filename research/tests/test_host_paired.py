"""research/host_paired.py: the implementations alternate call by call in
blocks, the summary compares each with the first, and what cannot run is
reported, not timed (CPU, tiny preset)."""
import json

import pytest
import torch

from research.tests.tools import assert_usage_error, load


def test_summary_compares_each_implementation_with_the_first():
    blocks = [{"a": [1.0, 2.0, 3.0], "b": [2.0, 2.0, 2.0]},
              {"a": [5.0, 5.0, 5.0], "b": [4.0, 4.0, 4.0]}]
    summary = load("host_paired.py")["summarize"](blocks, "a")
    assert summary["a"] == dict(median_us=4.0, block_medians_us=[2.0, 5.0])
    assert summary["b"]["median_us"] == 3.0 and summary["b"]["block_medians_us"] == [2.0, 4.0]
    # Rounds: 1/2, 2/2, 3/2, 5/4 x 3: median 1.25.
    assert summary["b"]["first_over_this"] == pytest.approx(1.25)
    # Block 1: 2 against 2 (not lower); block 2: 5 against 4.
    assert summary["b"]["blocks_first_lower"] == 0


def test_blocks_alternate_the_calls_and_warm_up_once():
    order = []
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    times = load("host_paired.py")["cell_times"](calls, torch.device("cpu"),
                                                 blocks=2, reps=2, warmup=3)
    assert order == ["a"] * 3 + ["b"] * 3 + ["a", "b", "b", "a"] * 2
    assert [sorted(block) for block in times] == [["a", "b"]] * 2
    assert all(len(block["a"]) == 2 for block in times)


def test_tool_times_what_runs_and_reports_what_cannot(tmp_path, capsys):
    assert load("host_paired.py")["main"](
        ["--presets", "tiny", "--dtypes", "fp32", "--impl", "msda_mm,reference,mmcv_cuda",
         "--blocks", "2", "--reps", "1", "--warmup", "1", "--device", "cpu",
         "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "n/a   tiny fp32 mmcv_cuda: mmcv's op is CUDA only"
    assert lines[1].split()[:3] == ["tiny", "fp32", "msda_mm"]
    assert lines[2].split()[:3] == ["tiny", "fp32", "reference"]
    assert "msda_mm lower in" in lines[2] and lines[2].endswith("/2 blocks")
    (cell,) = json.loads((tmp_path / "cpu-host-paired.json").read_text())["cells"]
    assert list(cell["impls"]) == ["msda_mm", "reference"]
    assert len(cell["impls"]["reference"]["block_medians_us"]) == 2


@pytest.mark.parametrize("args, message", [
    (["--reps", "0"], "must be >= 1"),
    (["--impl", "msda_mm"], "needs two implementations or more, got msda_mm"),
])
def test_bad_command_lines_are_refused(args, message, capsys):
    assert_usage_error("host_paired.py", args, message, capsys)
