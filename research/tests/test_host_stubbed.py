"""research/host_stubbed.py: inside cuda_path both ops take their CUDA
branches on CPU tensors and launch nothing, and the tool times them side by
side (tiny preset; a stand-in for the msda-triton package)."""
import os
import sys
import textwrap
from unittest import mock

import pytest
import torch

from research.tests.tools import assert_usage_error, load

# A stand-in for msda-triton's package: CUDA tensors only, one Triton kernel
# that marks its output where it runs.
_PEER = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _mark_kernel(out_ptr):
    tl.store(out_ptr, 1.0)


def multi_scale_deformable_attention(value, spatial_shapes, level_start_index,
                                     sampling_locations, attention_weights):
    if not value.is_cuda:
        raise ValueError("CUDA tensors only")
    B, _, M, D = value.shape
    out = value.new_zeros(B, sampling_locations.shape[1], M * D)
    _mark_kernel[(1,)](out)
    return out + 0 * (value.sum() + sampling_locations.sum() + attention_weights.sum())
'''


@pytest.fixture
def peer_dir(tmp_path):
    """A folder holding the stand-in package, imported from there only."""
    package = tmp_path / "msda_triton"
    package.mkdir()
    (package / "__init__.py").write_text("from .ops import multi_scale_deformable_attention\n")
    (package / "ops.py").write_text(textwrap.dedent(_PEER))
    yield tmp_path
    for name in [n for n in sys.modules if n.split(".")[0] == "msda_triton"]:
        del sys.modules[name]


def test_msda_mm_takes_the_cuda_branch_and_launches_nothing():
    tool = load("host_stubbed.py")
    inputs = tool["stub_inputs"]("tiny")
    run = tool["forward_backward"]("msda_mm", inputs)
    empty_like = torch.empty_like
    with tool["cuda_path"]():
        assert os.environ["TRITON_INTERPRET"] == "0"
        # Uninitialised gradients: NaN-filled buffers stay NaN where no kernel runs.
        with mock.patch.object(torch, "empty_like", lambda *args, **kw: empty_like(
                *args, **kw).fill_(float("nan"))):
            grad_value, grad_loc, grad_attn = run()
    # grad_value takes PyTorch's fill (fp32 without PDL), the rest no kernel at all;
    # the PyTorch reference (the CPU branch) would have computed every one.
    assert not grad_value.any()
    assert torch.isnan(grad_loc).all() and torch.isnan(grad_attn).all()
    assert not torch.ones(1).is_cuda
    assert all(torch.isfinite(g).all() for g in run())  # outside: the reference


def test_peer_takes_the_cuda_branch_and_launches_nothing(peer_dir):
    tool = load("host_stubbed.py")
    fn, missing = tool["load_peer"](peer_dir)
    assert missing is None and str(peer_dir) not in sys.path
    ops = sys.modules["msda_triton.ops"]
    kernel = ops._mark_kernel
    inputs = tool["stub_inputs"]("tiny")
    args = (inputs.value, inputs.spatial_shapes, inputs.level_start_index,
            inputs.sampling_locations, inputs.attention_weights)
    with tool["cuda_path"](fn):
        assert not fn(*args).any()  # the kernel would have marked element 0
    assert ops._mark_kernel is kernel
    with pytest.raises(ValueError, match="CUDA tensors only"):
        fn(*args)


def test_tool_times_both_side_by_side(peer_dir, capsys):
    assert load("host_stubbed.py")["main"](["--presets", "tiny", "--reps", "3",
                                            "--peers", str(peer_dir),
                                            "--profile", "msda_mm", "--profile-calls", "2",
                                            "--top", "3"]) == 0
    out = capsys.readouterr().out
    header, row = out.splitlines()[:2]
    assert "msda_mm us" in header and "msda_triton us" in header and "msda_mm / peer" in header
    assert row.split()[0] == "tiny" and len(row.split()) == 6, row
    assert "tiny msda_mm: cProfile of 2 calls" in out


def test_tool_without_the_peer_times_msda_mm_alone(tmp_path, capsys):
    assert load("host_stubbed.py")["main"](["--presets", "tiny", "--reps", "3",
                                            "--peers", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("n/a   msda_triton: msda_triton is not installed")
    assert "msda_triton us" not in lines[1] and lines[2].split()[0] == "tiny"


def test_bad_counts_are_refused(capsys):
    assert_usage_error("host_stubbed.py", ["--reps", "0"], "must be >= 1", capsys)
