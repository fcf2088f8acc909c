"""research/deterministic_split.py: its command line, its refusal without a
GPU, and on the GPU one cell's table: both backwards and each sort
timed, every deterministic run bitwise the first, each kernel of the
split named."""
import json

import pytest
import torch

from research.tests.tools import assert_needs_a_gpu, assert_usage_error, load


@pytest.mark.parametrize("args, message", [
    (["--gather-tiles", "2x16"], "expected BLOCK_SxWARPSxBLOCK_E"),
    (["--gather-tiles", "0x1x16"], "expected BLOCK_SxWARPSxBLOCK_E"),
    (["--sorts", "radix"], "'radix': choose from stable, counting"),
    (["--presets", "yolo"], "'yolo': choose from tiny, decoder"),
])
def test_bad_command_lines_say_what_is_wrong(args, message, capsys):
    assert_usage_error("deterministic_split.py", args, message, capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")
def test_without_cuda_the_tool_says_it_needs_a_gpu():
    assert_needs_a_gpu("deterministic_split.py")


@pytest.mark.gpu
def test_tool_times_both_backwards_and_splits_their_kernels(tmp_path):
    assert load("deterministic_split.py")["main"](
        ["--presets", "decoder", "--dtypes", "bf16", "--distributions", "uniform",
         "--gather-tiles", "1x1x4", "--sorts", "stable", "--budget-ms", "20",
         "--kernel-reps", "3", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*-deterministic-split.json")
    (cell,) = json.loads(path.read_text())["cells"]
    assert cell["sort"] == "counting"  # the decoder's rows: 0.9 entries each
    assert list(cell["graph_us"]) == ["default", "deterministic", "gather 1x1x4",
                                      "stable sort"]
    assert all(t > 0 for t in cell["graph_us"].values())
    assert cell["bitwise_equal"] == {"deterministic": True, "gather 1x1x4": True}
    assert cell["repeatable"] == {"deterministic": True, "gather 1x1x4": True,
                                  "stable sort": True}
    # bf16 grad_value: exact or fp32 sums rounded once to bf16 (2**-9 relative).
    errors = cell["grad_value_error"]
    assert all(errors[name] < 4e-3 for name in cell["repeatable"]), errors
    kernels = cell["kernels_us"]
    assert list(kernels) == ["default", "deterministic", "stable sort"]
    for kernel in ("msda_bwd_kernel", "grad_value_bound_kernel", "bucket_fill_kernel",
                   "grad_value_gather_kernel"):
        assert kernels["deterministic"][kernel] > 0, kernels
    for kernel in ("msda_bwd_kernel", "sorted_fill_kernel", "grad_value_gather_kernel"):
        assert kernels["stable sort"][kernel] > 0, kernels
    assert "grad_value_gather_kernel" not in kernels["default"]
