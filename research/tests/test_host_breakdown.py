"""research/host_breakdown.py and research/host.py: every piece is timed,
the "no launch" pieces really launch nothing, and the tool writes its JSON
(CPU: Triton interpreter, the tiny preset)."""
import json
import runpy
from pathlib import Path
from unittest import mock

import pytest
import torch

from bench.op.inputs import make_inputs
from bench.op.presets import PRESETS
from msda_mm.ops.backward.launcher import launch_backward
from msda_mm.ops.forward.launcher import launch_forward
from research import host


def _main(argv):
    return runpy.run_path(str(Path(__file__).resolve().parents[1] / "host_breakdown.py"))[
        "main"](argv)


def test_no_launches_skips_the_kernels_and_restores_them():
    inputs = make_inputs(PRESETS["tiny"], "uniform", seed=0)
    kernels = [getattr(module, name) for module, name in host._KERNELS]
    with host.no_launches():
        # Uninitialised outputs: NaN-filled buffers stay NaN if no kernel runs.
        with mock.patch.object(torch.Tensor, "new_empty",
                               lambda t, *size: torch.full(size, float("nan"), dtype=t.dtype)):
            fwd = launch_forward(inputs.value, inputs.spatial_shapes,
                                 inputs.sampling_locations,
                                 inputs.attention_weights)
        assert torch.isnan(fwd).all()
        empty_like = torch.empty_like
        with mock.patch.object(torch, "empty_like", lambda *args, **kw: empty_like(
                *args, **kw).fill_(float("nan"))):
            out = launch_backward(inputs.grad_output, inputs.value, inputs.spatial_shapes,
                                  inputs.sampling_locations,
                                  inputs.attention_weights, False)
    # Neither the fill (zero_fill_kernel in the interpreter) nor the
    # backward kernel ran: grad_value is as allocated.
    assert torch.isnan(out[0]).all()
    assert [getattr(module, name) for module, name in host._KERNELS] == kernels
    real = launch_backward(inputs.grad_output, inputs.value, inputs.spatial_shapes,
                           inputs.sampling_locations,
                           inputs.attention_weights, False)
    assert torch.count_nonzero(real[0]) > 0


def test_ordinary_launches_bypass_fast_launch_and_restore_it():
    fast = [getattr(module, name) for module, name in host._KERNELS]
    with host.ordinary_launches():
        assert [getattr(module, name) for module, name in host._KERNELS] == [f.fn for f in fast]
        inputs = make_inputs(PRESETS["tiny"], "uniform", seed=0)
        out = launch_forward(inputs.value, inputs.spatial_shapes,
                             inputs.sampling_locations, inputs.attention_weights)
    assert [getattr(module, name) for module, name in host._KERNELS] == fast
    torch.testing.assert_close(out, launch_forward(
        inputs.value, inputs.spatial_shapes,
        inputs.sampling_locations, inputs.attention_weights), rtol=0, atol=0)


def test_tool_times_every_piece(tmp_path, capsys):
    assert _main(["--presets", "tiny", "--dtypes", "fp32", "--device", "cpu",
                                "--budget-ms", "1", "--profile-calls", "1", "--top", "3",
                                "--torch-profile-calls", "2",
                                "--out", str(tmp_path)]) == 0
    cell, = json.loads((tmp_path / "cpu-host-breakdown.json").read_text())["cells"]
    inputs = make_inputs(PRESETS["tiny"], "uniform", seed=0)
    assert list(cell["host_us"]) == list(host.pieces(inputs))  # no floor on CPU
    assert all(us > 0 for us in cell["host_us"].values())
    # The interpreter runs the kernel in Python: far slower than no launch.
    assert cell["host_us"]["launch_backward"] > 10 * cell["host_us"][
        "launch_backward, no launch"]
    assert set(cell["profiles"]) == {"launch_forward", "launch_backward"}
    assert "cProfile of 1 x launch_backward" in capsys.readouterr().out
    # The autograd node of the op's backward is among the events, once a call.
    rows = cell["torch_profile"]
    assert len(rows) == 3 and all(r["self_us"] > 0 for r in rows)
    assert any(r["name"] == "EagerMSDABackward" and r["calls"] == 1 for r in rows), rows


@pytest.mark.gpu
def test_tool_on_cuda_measures_the_floor_and_the_launches(tmp_path):
    assert _main(["--presets", "decoder", "--dtypes", "bf16", "--budget-ms", "20",
                  "--torch-profile-calls", "5", "--top", "40", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*-host-breakdown.json")
    cell, = json.loads(path.read_text())["cells"]
    times = cell["host_us"]
    assert times["floor, backward in Python"] > times["floor: x * 2 + autograd.grad"] > 0
    assert times["launch_backward"] > times["launch_backward, no launch"] > 0
    # The backward node runs on autograd's CUDA thread: the profile has it.
    # Triton launches through cuLaunchKernelEx where it sets launch
    # attributes (the backward's PDL), cuLaunchKernel otherwise.
    names = {r["name"] for r in cell["torch_profile"]}
    assert "EagerMSDABackward" in names, names
    assert names & {"cuLaunchKernel", "cuLaunchKernelEx"}, names
    assert times["op forward + autograd.grad, backward on the calling thread"] > 0


def test_cpu_without_the_interpreter_is_refused(monkeypatch, capsys):
    # The op would run the PyTorch reference there, the launchers fail.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(SystemExit):
        _main(["--device", "cpu"])
    assert "--device cpu needs TRITON_INTERPRET=1" in capsys.readouterr().err
