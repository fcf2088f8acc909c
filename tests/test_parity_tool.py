"""tools/parity.py on CPU: the same checkpoint evaluated with msda_mm's and
mmcv's MSDA passes with near-identical layer outputs; a perturbed mmcv side
fails; a short training run writes both loss curves; grads and kernels run
on one batch; and the op switch swaps exactly what it says (on mmcv-lite
also mmcv's CUDA entry point)."""
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

from msda_mm.compat import MMCV_LITE
from msda_mm.datasets.synthetic import ann_file
from msda_mm.e2e import attention
from msda_mm.models import TritonMSDeformAttn

# isort: split
# After msda_mm, whose mmcv-lite shims make these importable.
from mmcv.ops import MultiScaleDeformableAttention, multi_scale_deform_attn
from mmdet.registry import MODELS

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"

CONFIG = str(ROOT / "configs/synthetic/dino_tiny_cpu.py")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """--cfg-options that cut the CPU demo to 8 training images (two batches
    of 4) and 2 test images, and a checkpoint of its random initialisation."""
    folder = tmp_path_factory.mktemp("parity")
    root = f"{folder}/data/"
    dataset = {"data_root": root, "synthetic_cfg.num_train": 8, "synthetic_cfg.num_val": 2}
    options = ["--cfg-options", f"test_evaluator.ann_file={root}{ann_file('val')}"]
    options += [f"{loader}.dataset.{key}={value}"
                for loader in ("train_dataloader", "test_dataloader")
                for key, value in dataset.items()]
    init_default_scope("mmdet")
    model = MODELS.build(Config.fromfile(CONFIG).model)
    model.init_weights()
    checkpoint = folder / "random.pth"
    torch.save(dict(state_dict=model.state_dict()), checkpoint)
    return options, str(checkpoint)


def _parity(*args: str) -> subprocess.CompletedProcess:
    # TRITON_INTERPRET=0: CPU tensors take the PyTorch reference (the
    # interpreter is far too slow for a model).
    # PYTHONPATH: this checkout's msda_mm, wherever the installed one is.
    # One intra-op thread: the model's ops are small, and on a busy 2-core
    # box multi-threaded ones wait at OpenMP barriers, 10x slower.
    env = dict(os.environ, TRITON_INTERPRET="0", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, str(TOOLS / "parity.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_eval_of_one_checkpoint_passes(tiny, tmp_path):
    options, checkpoint = tiny
    run = _parity("eval", CONFIG, checkpoint, "--out", str(tmp_path), "--tolerance-layer", "1e-4",
                  *options)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    # Both COCO AP tables, the comparison and the verdict.
    assert log.count("Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all") == 2
    assert "PASS: AP tolerance 0.1 AP points: all 6 metrics within" in log
    report = json.loads((tmp_path / "parity_eval.json").read_text())
    assert report["passed"] and report["tolerance_ap"] == 0.1
    assert all(m["delta_ap"] == 0 for m in report["metrics"])
    # 3 encoder and 3 decoder layers; the implementations differ only in
    # float rounding.
    assert len(report["layers"]) == 6
    assert all(r["max_abs_diff"] < 1e-4 * max(1.0, r["max_abs_mmcv"]) for r in report["layers"])


@pytest.mark.slow
def test_grads_compares_three_backward_passes_of_one_batch(tiny, tmp_path):
    options, checkpoint = tiny
    # An fp32 config on the CPU: fp32_compute changes nothing and the
    # reference is deterministic, so every difference is exactly zero.
    run = _parity("grads", CONFIG, "--checkpoint", checkpoint, "--out", str(tmp_path), *options)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    report = json.loads((tmp_path / "parity_grads.json").read_text())
    assert set(report["losses"]) == {"configured", "configured_again", "fp32_grad_accum",
                                     "fp32_compute"}
    assert len(set(report["losses"].values())) == 1
    names = {r["parameter"] for r in report["parameters"]}
    assert "encoder.layers.0.self_attn.value_proj.weight" in names and len(names) > 100
    assert all(row["max"] == 0 for row in report["summary"].values())
    assert set(report["summary"]) == {"floor", "fp32_compute", "bf16_value"}
    assert report["checkpoint"] == checkpoint
    assert "most moved by fp32_compute" in run.stdout


@pytest.mark.slow
def test_kernels_says_when_no_call_is_bf16(tiny, tmp_path):
    # The CPU demo is fp32: no op call to check, which is exit code 4, not a pass.
    options, checkpoint = tiny
    run = _parity("kernels", CONFIG, "--checkpoint", checkpoint, "--out", str(tmp_path),
                  *options)
    assert run.returncode == 4, (run.stdout + run.stderr)[-4000:]
    assert "had a bf16 value: nothing to check" in run.stdout
    report = json.loads((tmp_path / "parity_kernels.json").read_text())
    assert report["calls"] == [] and report["checkpoint"] == checkpoint


@pytest.fixture
def parity_tool(monkeypatch):
    """tools/parity.py's globals (its siblings common.py, train.py importable)."""
    monkeypatch.syspath_prepend(str(TOOLS))
    return runpy.run_path(str(TOOLS / "parity.py"))


@pytest.mark.slow
def test_eval_fails_when_the_mmcv_side_differs(tiny, tmp_path, parity_tool, monkeypatch,
                                               reference_backend):
    options, checkpoint = tiny
    exact = multi_scale_deform_attn.multi_scale_deformable_attn_pytorch
    # mmcv's forward calls this for CPU tensors: only the mmcv side changes.
    monkeypatch.setattr(multi_scale_deform_attn, "multi_scale_deformable_attn_pytorch",
                        lambda *args: exact(*args) + 0.01)
    status = parity_tool["main"](["eval", CONFIG, checkpoint, "--out", str(tmp_path),
                                  "--max-batches", "1", "--tolerance-layer", "1e-3", *options])
    assert status == 1
    report = json.loads((tmp_path / "parity_eval.json").read_text())
    assert not report["passed"] and "layer tolerance 0.001: exceeded by" in report["verdict"]
    assert all(r["max_abs_diff"] > 1e-3 for r in report["layers"])


@pytest.mark.slow
def test_train_writes_both_loss_curves(tiny, tmp_path):
    options, _ = tiny
    # Three steps of batch 4 over 8 images: the third starts a second epoch.
    run = _parity("train", CONFIG, "--iters", "3", "--seed", "1", "--out", str(tmp_path),
                  *options)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    report = json.loads((tmp_path / "parity_train.json").read_text())
    assert len(report["loss"]["triton"]) == len(report["loss"]["mmcv"]) == 3
    assert len(report["rel_diff"]) == 3 and report["max_rel_diff"] < 1e-4
    assert report["log_vars"]["mmcv"]["loss"] == report["loss"]["mmcv"]
    assert (tmp_path / "parity_train.png").read_bytes().startswith(b"\x89PNG")
    assert "max relative difference of the total loss" in run.stdout


def test_bad_command_lines_say_what_is_wrong(parity_tool, capsys):
    with pytest.raises(SystemExit):
        parity_tool["parse_args"](["eval", CONFIG, "model.pth", "--tolerance-ap", "-1"])
    assert "'-1' is not a finite number >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parity_tool["parse_args"](["train", CONFIG, "--iters", "0"])
    assert "'0' is not an integer >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="checkpoint not found: missing.pth"):
        parity_tool["main"](["eval", CONFIG, "missing.pth"])
    with pytest.raises(SystemExit, match="config file not found: missing.py"):
        parity_tool["main"](["train", "missing.py"])


@pytest.fixture
def parity_commands(monkeypatch):
    """tools/parity_commands.py's globals (what tools/parity.py runs after its command line)."""
    monkeypatch.syspath_prepend(str(TOOLS))
    return runpy.run_path(str(TOOLS / "parity_commands.py"))


def test_kernels_report_passes_only_if_every_call_does(parity_commands, capsys):
    call = dict(call=0, value=[2, 30, 8, 32], locations=[2, 7, 8, 4, 4, 2],
                fp32_grad_accum=True, output=-0.4, grad_value=-0.2, grad_loc=3e-7,
                grad_attn=2e-7, passed=True)
    native = dict(call, fp32_grad_accum=False, grad_value=None)
    assert parity_commands["_print_kernels"]("cfg.py", [call, native], "out.json") == 0
    assert "PASS: 2 of 2 checks within" in capsys.readouterr().out
    bad = dict(call, call=1, output=1.5, passed=False)
    assert parity_commands["_print_kernels"]("cfg.py", [call, native, bad], "out.json") == 3
    out = capsys.readouterr().out
    assert "FAIL: 2 of 3 checks within" in out and out.count("FAIL") == 2


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.triton = TritonMSDeformAttn(embed_dims=8, num_heads=2, num_levels=1, num_points=2)
        self.mmcv = MultiScaleDeformableAttention(embed_dims=8, num_heads=2, num_levels=1,
                                                  num_points=2)


@pytest.mark.parametrize("op, cls", [("triton", TritonMSDeformAttn),
                                     ("mmcv", MultiScaleDeformableAttention)])
def test_use_op_switches_every_attention_and_restores(op, cls):
    model = TwoLayers()
    with attention.use_op(model, op):
        assert type(model.triton) is type(model.mmcv) is cls
    assert type(model.triton) is TritonMSDeformAttn
    assert type(model.mmcv) is MultiScaleDeformableAttention


@pytest.mark.skipif(not MMCV_LITE, reason="mmcv's own CUDA kernels need no re-routing")
def test_mmcv_side_on_mmcv_lite_uses_mmcv_pytorch_not_triton():
    function = multi_scale_deform_attn.MultiScaleDeformableAttnFunction
    routed = vars(function)["apply"]
    with attention.use_op(TwoLayers(), "mmcv"):
        assert function.apply is attention._mmcv_pytorch_sampler
    assert vars(function)["apply"] is routed
