"""tools/train.py and tools/test.py end to end on CPU: the tiny demo config,
cut to two iterations and a handful of images, trains, validates with the
COCO AP table and saves a checkpoint, which tools/test.py then evaluates;
and an AMP config on a machine without CUDA stops with a clear message."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tool_runs import tool_env, write_tiny_demo

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"

# Two iterations (8 images, batch 4, one epoch), validation on 4 images.
ONE_EPOCH = """
train_cfg = dict(max_epochs=1, val_interval=1)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))
"""
AP_TABLE = ("Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all", "bbox_mAP_copypaste")


def _tool(name: str, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, str(TOOLS / name), *args], cwd=ROOT, env=tool_env(),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_tiny_demo_trains_evaluates_and_tests(tmp_path):
    config = write_tiny_demo(tmp_path / "tiny_run.py", f"{tmp_path}/data/", 8, ONE_EPOCH)
    work_dir = tmp_path / "work"

    trained = _tool("train.py", str(config), "--work-dir", str(work_dir))
    log = trained.stdout + trained.stderr
    assert "Epoch(train) [1][2/2]" in log and "eta:" in log
    assert all(line in log for line in AP_TABLE)
    checkpoint = work_dir / "epoch_1.pth"
    assert checkpoint.is_file()

    results = tmp_path / "results.pkl"
    tested = _tool("test.py", str(config), str(checkpoint), "--work-dir", str(work_dir),
                   "--out", str(results))
    assert all(line in tested.stdout + tested.stderr for line in AP_TABLE)
    assert results.is_file()


@pytest.fixture
def train_tool(monkeypatch):
    """tools/train.py as a module (its sibling common.py importable)."""
    monkeypatch.syspath_prepend(str(TOOLS))
    monkeypatch.setenv("LOCAL_RANK", "0")  # what load_config would set, undone afterwards
    spec = importlib.util.spec_from_file_location("msda_mm_train_tool", TOOLS / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")
def test_amp_config_without_cuda_says_what_to_run(train_tool):
    with pytest.raises(SystemExit) as stop:
        train_tool.main([str(ROOT / "configs/dino_bf16.py")])
    message = str(stop.value)
    assert "needs a CUDA GPU" in message
    assert "configs/synthetic/dino_tiny_cpu.py" in message
    assert "--cfg-options optim_wrapper.type=OptimWrapper" in message


def test_optim_wrapper_override_turns_amp_config_into_fp32(train_tool):
    args = train_tool.parse_args([str(ROOT / "configs/dino_bf16.py"), "--cfg-options",
                                  "optim_wrapper.type=OptimWrapper"])
    cfg = train_tool.load_config(args)
    train_tool.check_precision(cfg, args.config)
    assert cfg.optim_wrapper.type == "OptimWrapper"
    assert "dtype" not in cfg.optim_wrapper and "loss_scale" not in cfg.optim_wrapper


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")
def test_selective_amp_config_without_cuda_is_refused_too(train_tool):
    args = train_tool.parse_args([
        str(ROOT / "configs/dino_bf16.py"), "--cfg-options",
        "optim_wrapper.type=SelectiveAmpOptimWrapper", "optim_wrapper.fp32_modules=[bbox_head]"])
    with pytest.raises(SystemExit, match="trains with SelectiveAmpOptimWrapper .bfloat16 mixed "
                                         "precision., which needs a CUDA GPU"):
        train_tool.check_precision(train_tool.load_config(args), args.config)


def test_optim_wrapper_override_drops_the_fp32_modules_too(train_tool):
    args = train_tool.parse_args([
        str(ROOT / "configs/dino_bf16.py"), "--cfg-options",
        "optim_wrapper.fp32_modules=[bbox_head]", "optim_wrapper.type=OptimWrapper"])
    cfg = train_tool.load_config(args)
    train_tool.check_precision(cfg, args.config)
    assert "fp32_modules" not in cfg.optim_wrapper and "dtype" not in cfg.optim_wrapper


@pytest.mark.parametrize("wrapper, amp", [("OptimWrapper", False), ("AmpOptimWrapper", True),
                                          ("SelectiveAmpOptimWrapper", True)])
def test_uses_amp_knows_the_autocasting_wrappers(train_tool, wrapper, amp):
    import common  # tools/common.py, importable through the fixture's path

    assert common.uses_amp({"type": wrapper}) is amp


def test_amp_flag_leaves_a_config_that_autocasts_already(train_tool):
    # As mmdet's tool: --amp on an AMP config (here with fp32 modules) keeps
    # its wrapper, which plain AmpOptimWrapper would refuse to build.
    args = train_tool.parse_args([
        str(ROOT / "configs/dino_bf16.py"), "--amp", "--cfg-options",
        "optim_wrapper.type=SelectiveAmpOptimWrapper", "optim_wrapper.fp32_modules=[bbox_head]"])
    cfg = train_tool.load_config(args)
    train_tool.apply_train_args(cfg, args)
    assert (cfg.optim_wrapper.type, cfg.optim_wrapper.dtype) == ("SelectiveAmpOptimWrapper",
                                                                 "bfloat16")
    args = train_tool.parse_args([str(ROOT / "configs/dino_fp32.py"), "--amp"])
    cfg = train_tool.load_config(args)
    train_tool.apply_train_args(cfg, args)
    assert (cfg.optim_wrapper.type, cfg.optim_wrapper.loss_scale) == ("AmpOptimWrapper", "dynamic")


def test_start_if_nothing_to_resume_goes_to_the_verified_hook(train_tool):
    args = train_tool.parse_args([str(ROOT / "configs/synthetic/dino_tiny_cpu.py"), "--resume",
                                  "--start-if-nothing-to-resume"])
    cfg = train_tool.load_config(args)
    train_tool.apply_train_args(cfg, args)
    assert cfg.default_hooks.checkpoint.start_if_nothing_to_resume is True
    assert (cfg.resume, cfg.load_from) == (True, None)


def test_start_if_nothing_to_resume_needs_an_automatic_resume(train_tool, capsys):
    with pytest.raises(SystemExit):
        train_tool.parse_args([str(ROOT / "configs/dino_fp32.py"), "--resume", "x.pth",
                               "--start-if-nothing-to-resume"])
    assert "--start-if-nothing-to-resume goes with --resume (without CKPT)" in \
        capsys.readouterr().err


@pytest.mark.parametrize("checkpoint, verified", [
    ("dict(type='CheckpointHook', interval=2)", dict(type="VerifiedCheckpointHook", interval=2)),
    ("dict(type='MyCheckpointHook')", dict(type="MyCheckpointHook")),
    ("None", None)])
def test_the_tools_verify_a_plain_checkpoint_hook(train_tool, tmp_path, checkpoint, verified):
    config = tmp_path / "config.py"
    config.write_text(f"default_hooks = dict(checkpoint={checkpoint})\n")
    cfg = train_tool.load_config(train_tool.parse_args([str(config)]))
    assert cfg.default_hooks.checkpoint == verified
    config.write_text("model = dict()\n")
    cfg = train_tool.load_config(train_tool.parse_args([str(config)]))
    assert cfg.default_hooks.checkpoint == dict(type="VerifiedCheckpointHook", interval=1)
