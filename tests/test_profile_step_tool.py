"""tools/profile_step.py on CPU: two profiled steps of the tiny demo model
on synthetic images of a requested size, and the trace summary's device
figures from CUDA-like events (no GPU here)."""
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mmengine.config import Config
from torch.autograd import DeviceType
from torch.autograd.profiler_util import Interval

from bench.step.profiling import STEP, SYNC_EVENTS, summarise

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "profile_step.py"
CONFIG = str(ROOT / "configs/synthetic/dino_tiny_cpu.py")
KEYS = {"config", "batch_size", "image_size", "precision", "msda_modules", "msda_kernels",
        "compiled_modules",
        "warmup", "iters",
        "profile_iters", "ms_per_iter", "ms_per_iter_median", "images_per_s", "peak_memory_mib",
        "peak_reserved_mib",
        "device_ms_per_iter", "msda_ms_per_iter", "msda_share", "device_top", "cpu_ms_per_iter",
        "host_top",
        "sync_sources_per_iter", "sync_sources_method", "sync_iters", "waits_per_iter",
        "sync_points_per_iter", "step_ms", "environment"}


def _tool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # TRITON_INTERPRET=0: the model's MSDA runs the PyTorch reference on CPU.
    # PYTHONPATH: this checkout's msda_mm, wherever the installed one is.
    # One intra-op thread: the model's ops are small, and on a busy 2-core
    # box multi-threaded ones wait at OpenMP barriers, 10x slower.
    env = dict(os.environ, TRITON_INTERPRET="0", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, str(TOOL), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_two_steps_on_cpu_write_the_report(tmp_path):
    out = tmp_path / "out"
    # cwd=tmp_path: the synthetic images are written under tmp_path/data/.
    run = _tool(CONFIG, "--batch-size", "2", "--iters", "2", "--warmup", "1", "--profile-iters",
                "1", "--image-size", "64", "96", "--out", str(out), cwd=tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert (tmp_path / "data/synthetic_64x96/train").is_dir()
    report = json.loads((out / "profile.json").read_text())
    assert set(report) == KEYS
    assert (report["batch_size"], report["image_size"], report["precision"]) == (2, [64, 96],
                                                                                  "fp32")
    assert report["msda_modules"] == {"TritonMSDeformAttn": 6}
    assert report["msda_kernels"] == {"TritonMSDeformAttn": "msda_mm PyTorch reference (CPU)"}
    assert len(report["step_ms"]) == 2 and report["ms_per_iter"] > 0
    assert report["images_per_s"] == pytest.approx(2e3 / report["ms_per_iter"])
    # CPU: host time only.
    assert report["device_ms_per_iter"] is report["msda_share"] is None
    assert report["device_top"] == []
    assert report["peak_memory_mib"] is report["peak_reserved_mib"] is None
    assert report["cpu_ms_per_iter"] > 0
    assert 0 < len(report["host_top"]) <= 15
    assert set(report["sync_points_per_iter"]) == set(SYNC_EVENTS)
    # DINO reads losses and matching costs back to the host every step.
    assert report["sync_points_per_iter"]["aten::_local_scalar_dense"] > 0
    markdown = (out / "profile.md").read_text()
    assert "| batch | images | precision | ms/iter |" in markdown
    assert "MSDA: 6 x TritonMSDeformAttn: msda_mm PyTorch reference (CPU)" in markdown
    # Off CUDA the waits are attributed from the trace (the sync debug mode is CUDA's).
    assert report["sync_sources_method"] == "torch.profiler trace"
    assert report["waits_per_iter"] is None and report["sync_iters"] == 2


@pytest.fixture
def profile_tool(monkeypatch):
    """tools/profile_step.py's globals (its siblings common.py, train.py importable)."""
    monkeypatch.syspath_prepend(str(TOOL.parent))
    return runpy.run_path(str(TOOL))


@pytest.fixture
def profile_measure(monkeypatch):
    """tools/profile_step_measure.py's globals (what tools/profile_step.py runs)."""
    monkeypatch.syspath_prepend(str(TOOL.parent))
    return runpy.run_path(str(TOOL.parent / "profile_step_measure.py"))


def test_the_configs_compile_hooks_run_before_the_steps(profile_measure):
    # Runner.train() would run them in before_train; the tool runs no loop.
    from mmengine.hooks import Hook
    from torch import nn

    from msda_mm.engine import CompileSubmodulesHook

    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    others = Hook()
    others.before_train = lambda runner: pytest.fail("only compile hooks may run")
    runner = SimpleNamespace(model=model, hooks=[
        others, CompileSubmodulesHook(modules=["1"], backend="eager")])
    assert profile_measure["compile_as_configured"](runner) == ["1"]
    assert model[1]._compiled_call_impl is not None and model[0]._compiled_call_impl is None


@pytest.mark.parametrize("args, message", [
    (["--image-size", "0", "64"], "'0' is not an integer >= 1"),
    (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
    (["--sync-iters", "-2"], "--sync-iters must be >= 0, got -2"),
    (["--amp", "fp8"], "invalid choice: 'fp8'"),
])
def test_bad_command_lines_say_what_is_wrong(profile_tool, capsys, args, message):
    with pytest.raises(SystemExit):
        profile_tool["parse_args"]([CONFIG, *args])
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")
def test_amp_without_cuda_stops_before_building(profile_tool, tmp_path):
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        profile_tool["main"]([CONFIG, "--amp", "bf16", "--out", str(tmp_path)])


@pytest.mark.parametrize("wrapper, label", [
    (dict(type="OptimWrapper"), "fp32"),
    (dict(type="AmpOptimWrapper", dtype="bfloat16"), "AMP bfloat16"),
    (dict(type="AmpOptimWrapper"), "AMP float16"),
    (dict(type="SelectiveAmpOptimWrapper", dtype="bfloat16", fp32_modules=["bbox_head", "neck"]),
     "AMP bfloat16, fp32 bbox_head, neck"),
])
def test_the_report_names_the_precision(profile_measure, wrapper, label):
    assert profile_measure["precision"](SimpleNamespace(optim_wrapper=wrapper)) == label


@pytest.mark.parametrize("amp, wrapper", [
    ("fp16", dict(type="SelectiveAmpOptimWrapper", dtype="float16", loss_scale="dynamic",
                  fp32_modules=["bbox_head"])),
    ("none", dict(type="OptimWrapper")),
])
def test_amp_flag_keeps_a_configs_own_amp_wrapper(profile_tool, profile_measure, amp, wrapper):
    cfg = Config(dict(optim_wrapper=dict(type="SelectiveAmpOptimWrapper", dtype="bfloat16",
                                         fp32_modules=["bbox_head"])))
    args = profile_tool["parse_args"]([CONFIG, "--amp", amp])
    args.config = "config.py"
    if amp != "none" and not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="needs a CUDA GPU"):  # after the update
            profile_measure["apply_args"](cfg, args)
    else:
        profile_measure["apply_args"](cfg, args)
    assert cfg.optim_wrapper.to_dict() == wrapper


def _event(name, start, end, device=DeviceType.CPU, self_us=0.0, thread=1):
    return SimpleNamespace(name=name, time_range=Interval(start, end), device_type=device,
                           is_async=False, self_cpu_time_total=self_us, thread=thread)


def test_summary_of_device_and_host_events():
    # Two steps; an item() in each, a host event outside them, a thread
    # that only waits, and kernels (msda_mm's and others) of 10 + 30 us per
    # step.
    events = [_event(STEP, 0, 100), _event(STEP, 200, 300),
              _event("aten::_local_scalar_dense", 10, 20, self_us=10.0),
              _event("aten::_local_scalar_dense", 210, 220, self_us=10.0),
              _event("<built-in method item of Tensor object at 0x7f00>", 205, 225, self_us=4.0),
              _event("<built-in method item of Tensor object at 0x7f11>", 5, 25, self_us=4.0),
              _event("aten::copy_", 150, 160, self_us=50.0),
              # The CUDA runtime's wait behind the first item(): counted as
              # a sync point, not attributed a second time.
              _event("cudaStreamSynchronize", 12, 18, self_us=1.0),
              _event("<built-in method acquire of _thread.lock object at 0x7f22>", 1, 99,
                     self_us=98.0, thread=2),
              _event("msda_fwd_kernel", 30, 40, DeviceType.CUDA),
              _event("msda_bwd_kernel", 230, 240, DeviceType.CUDA),
              _event("gemm", 50, 80, DeviceType.CUDA), _event("gemm", 250, 280, DeviceType.CUDA),
              # The device-side copies of the step ranges (named like the
              # step, which contains "msda") are no kernels, and a kernel on
              # a second stream inside a gemm adds no busy time.
              _event(STEP, 0, 100, DeviceType.CUDA), _event(STEP, 200, 300, DeviceType.CUDA),
              _event("fill", 60, 70, DeviceType.CUDA),
              # Python frames: each item() is attributed to the innermost
              # frame outside torch around it, mmdet's loss here.
              _event("mmdet/models/losses/x.py(10): loss", 2, 99),
              _event("mmdet/models/losses/x.py(20): helper", 3, 9),
              _event("torch/_tensor.py(5): item", 9, 21),
              _event("mmdet/models/losses/x.py(10): loss", 202, 299)]
    s = summarise(events, iters=2)
    assert s["device_ms_per_iter"] == pytest.approx(0.040)
    assert s["msda_ms_per_iter"] == pytest.approx(0.010)
    assert s["msda_share"] == pytest.approx(0.25)
    # Per kernel name, most time first; the step ranges' device copies are no kernels.
    assert [(k["name"], k["calls_per_iter"], k["ms_per_iter"]) for k in s["device_top"]] == [
        ("gemm", 1, pytest.approx(0.030)), ("msda_fwd_kernel", 0.5, pytest.approx(0.005)),
        ("msda_bwd_kernel", 0.5, pytest.approx(0.005)), ("fill", 0.5, pytest.approx(0.005))]
    assert s["device_top"][0]["share_of_busy"] == pytest.approx(0.75)
    assert s["cpu_ms_per_iter"] == pytest.approx(0.0145)
    # The Python frames take no self time here, so they rank last.
    assert [h["name"] for h in s["host_top"]] == [
        "aten::_local_scalar_dense", "<built-in method item of Tensor object>",
        "cudaStreamSynchronize", "mmdet/models/losses/x.py(10): loss",
        "mmdet/models/losses/x.py(20): helper",
        "torch/_tensor.py(5): item"]
    assert s["host_top"][0]["calls_per_iter"] == 1 and s["host_top"][0]["share_of_host"] == \
        pytest.approx(10 / 14.5)
    assert s["sync_points_per_iter"]["aten::_local_scalar_dense"] == 1
    assert s["sync_points_per_iter"]["cudaStreamSynchronize"] == 0.5
    assert s["sync_sources_per_iter"] == [
        dict(frame="mmdet/models/losses/x.py(10): loss", per_iter=1)]
    with pytest.raises(ValueError, match="record_function"):
        summarise([e for e in events if e.device_type != DeviceType.CPU or e.name != STEP],
                  iters=2)


def test_waits_find_their_frames_under_another_thread_id():
    # torch 2.11 on the H200 gave the Python frames another thread id than
    # the ops: the waits are then placed in the main Python thread's frames
    # (the thread with the most), not in a lone frame of some other thread.
    events = [_event(STEP, 0, 100),
              _event("aten::_local_scalar_dense", 10, 20),
              _event("aten::nonzero", 40, 45),
              _event("aten::nonzero", 70, 75),
              _event("mmdet/models/losses/x.py(10): loss", 2, 50, thread=7),
              _event("mmdet/models/dense_heads/h.py(3): match", 60, 80, thread=7),
              _event("mmengine/dataset/w.py(9): worker", 5, 90, thread=8)]
    s = summarise(events, iters=1)
    assert s["sync_sources_per_iter"] == [
        dict(frame="mmdet/models/losses/x.py(10): loss", per_iter=2),
        dict(frame="mmdet/models/dense_heads/h.py(3): match", per_iter=1)]


def test_every_msda_kernel_counts_as_msda():
    from bench.step.profiling import MSDA_KERNEL
    for name in ("msda_fwd_kernel", "msda_fwd_pairs_kernel", "msda_bwd_kernel",
                 "ms_deformable_im2col_gpu_kernel"):
        assert MSDA_KERNEL.search(name), name
    assert not MSDA_KERNEL.search("msda_mm::train_step")


def test_the_report_lists_the_device_kernels(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    from profile_step_measure import markdown
    long_name = "void cutlass::Kernel<" + "x" * 200 + ">"
    events = [_event(STEP, 0, 100), _event(long_name, 10, 40, DeviceType.CUDA),
              _event("msda_fwd_kernel", 50, 60, DeviceType.CUDA)]
    report = dict(summarise(events, iters=1), config="c.py", batch_size=2, image_size=[8, 8],
                  precision="fp32", ms_per_iter=1.0, images_per_s=2000.0, peak_memory_mib=1.0,
                  peak_reserved_mib=2.0,
                  msda_modules={}, msda_kernels={}, compiled_modules=[], warmup=1,
                  profile_iters=1, sync_sources_method="sync debug mode", waits_per_iter=0,
                  sync_iters=1)
    text = markdown(report)
    assert "| kernel | calls/iter | ms/iter | share of device-busy |" in text
    assert f"| `{long_name[:87]}...` | 1.0 | 0.03 | 75.0% |" in text
    assert "| `msda_fwd_kernel` | 1.0 | 0.01 | 25.0% |" in text
    assert "| 1 MiB | 2 MiB |" in text
