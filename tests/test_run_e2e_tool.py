"""tools/run_e2e.py, the driver behind the committed H200 end-to-end
results, in its CPU smoke mode (E2E_SMOKE=1: the tiny config, a few steps):
every step of the `train` part runs and the results are packed."""
import os
import runpy
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "run_e2e.py"


def _run(part, out, *options, gpus="", timeout=600, **env):
    """run_e2e.py PART OUT OPTIONS in smoke mode with CUDA_VISIBLE_DEVICES=gpus
    and the E2E_* settings given (none inherited); the tool sets
    TRITON_INTERPRET itself."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("E2E_") and k != "TRITON_INTERPRET"}
    environ.update(env, E2E_SMOKE="1", CUDA_VISIBLE_DEVICES=gpus)
    return subprocess.run([sys.executable, str(TOOL), part, str(out), *options], env=environ,
                          capture_output=True, text=True, timeout=timeout)


def _plan():
    """tools/e2e_plan.py's globals: the variants and schedules."""
    return runpy.run_path(str(ROOT / "tools" / "e2e_plan.py"))


def _steps(summary: str) -> dict[str, str]:
    """Each step's summary line, by step name."""
    return {line.split()[0]: line for line in summary.splitlines() if " rc=" in line}


def test_train_part_runs_every_step_and_packs_results(tmp_path):
    # No GPUs listed: the two lanes run one after the other.
    run = _run("train", tmp_path)
    summary = (tmp_path / "train.log").read_text()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = _steps(summary)
    assert set(steps) == {"prepare_data", "train_bf16", "parity_eval", "profile_b2_bf16",
                          "train_fp32", "profile_b1_bf16", "profile_b1_fp32",
                          "profile_b2_fp32"}, summary
    assert all(line.split()[1] == "rc=0" for line in steps.values()), summary
    assert "PASS" in summary, summary
    with tarfile.open(tmp_path / "train.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("parity_eval/parity_eval.json") for n in names), names
    assert any(n.endswith("b2_fp32/profile.json") for n in names), names
    assert not any(n.endswith(".pth") for n in names), names


def test_seeds_part_trains_each_variant_per_seed(tmp_path):
    # The command line's options, where the other tests set E2E_*.
    run = _run("seeds", tmp_path, "--seeds", "3", "--variants", "fp32", "bf16_fp32accum")
    summary = (tmp_path / "seeds.log").read_text()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = _steps(summary)
    assert set(steps) == {"prepare_data", "train_fp32_seed3", "train_bf16_fp32accum_seed3"}, summary
    assert all(" rc=0 " in line for line in steps.values()), summary
    assert "randomness.seed=3" in steps["train_fp32_seed3"], summary
    assert "fp32_grad_accum" not in steps["train_fp32_seed3"], summary
    assert "self_attn_cfg.fp32_grad_accum=True" in steps["train_bf16_fp32accum_seed3"], summary
    assert summary.count("bbox_mAP_copypaste") == 4, summary  # 2 evaluations a run


def test_ap_part_runs_the_batch16_ap_schedule(tmp_path):
    # The batch-16 schedule with the host cut, on the variant that runs the
    # op in fp32 under bf16 AMP; seed 0 unless E2E_SEEDS; then the gradient
    # comparison and the kernel check of a bf16 variant.
    run = _run("ap", tmp_path, E2E_VARIANTS="bf16_fp32compute")
    summary = (tmp_path / "ap.log").read_text()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = _steps(summary)
    assert set(steps) == {"prepare_data", "train_bf16_fp32compute_seed0",
                          "grads_bf16_fp32compute_seed0", "kernels_bf16_fp32compute_seed0"}, summary
    # The smoke config is fp32: the kernel check finds no bf16 call (exit 4).
    kernels = steps.pop("kernels_bf16_fp32compute_seed0")
    assert " rc=4 " in kernels and "parity.py kernels" in kernels, summary
    assert "epoch_2.pth" in kernels and "fp32_compute=True" not in kernels, summary
    assert all(" rc=0 " in line for line in steps.values()), summary
    line = steps["train_bf16_fp32compute_seed0"]
    for option in ("train_dataloader.batch_size=16", "bbox_head.type=BatchedMatchingDINOHead",
                   "optimizer.fused=True", "self_attn_cfg.fp32_compute=True",
                   "cross_attn_cfg.fp32_compute=True", "randomness.seed=0",
                   # smoke: 2 epochs, evaluated (and saved) at the end, LR drop after 1
                   "train_cfg.max_epochs=2", "train_cfg.val_interval=2",
                   "param_scheduler.0.milestones=[1]", "checkpoint.interval=2"):
        assert option in line, summary
    assert "bbox_mAP_copypaste" in summary, summary
    assert "warning" not in summary, summary
    # The bf16 run's gradients against fp32_compute, on its first checkpoint.
    grads = steps["grads_bf16_fp32compute_seed0"]
    assert "parity.py grads" in grads and "epoch_2.pth" in grads, summary
    # ... as configured without the variant's own option: the op on bf16 values.
    assert "fp32_compute=True" not in grads, summary
    assert "checkpoint.max_keep_ckpts=-1" in line, summary  # the first one is still there
    assert "fp32_compute" in summary.split("# results", 1)[1], summary
    assert "No op call" in summary.split("# results", 1)[1], summary
    with tarfile.open(tmp_path / "ap.tar.gz") as tar:
        names = tar.getnames()
    for report in ("parity_grads/parity_grads.json", "parity_kernels/parity_kernels.json"):
        assert any(n.endswith(report) for n in names), report


def test_amp_part_runs_the_first_epochs_of_the_ap_schedule(tmp_path):
    # On CPU train.py refuses the AMP variants (SelectiveAmpOptimWrapper needs
    # CUDA): their command lines are what is checked; fp32 trains.
    run = _run("amp", tmp_path, E2E_VARIANTS="fp32 bf16_fp32head")
    summary = (tmp_path / "amp.log").read_text()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = _steps(summary)
    assert set(steps) == {"prepare_data", "train_fp32_seed0", "train_bf16_fp32head_seed0"}, summary
    fp32, head = steps["train_fp32_seed0"], steps["train_bf16_fp32head_seed0"]
    assert " rc=0 " in fp32 and " rc=1 " in head, summary
    for option in ("train_dataloader.batch_size=16", "param_scheduler.0.milestones=[1]",
                   "train_cfg.max_epochs=3", "train_cfg.val_interval=1000",
                   "checkpoint.save_last=False"):
        assert option in fp32 and option in head, summary
    # The cut comes after the schedule's own max_epochs, so it wins.
    assert fp32.index("train_cfg.max_epochs=2") < fp32.index("train_cfg.max_epochs=3"), summary
    assert "SelectiveAmpOptimWrapper" not in fp32, summary
    # E2E_WARMUP unset: the config itself (its own schedule), none derived.
    assert "tools/train.py configs/synthetic/dino_tiny_cpu.py " in fp32, summary
    assert not (ROOT / "work_dirs/e2e/amp/configs").exists()
    assert ("optim_wrapper.type=SelectiveAmpOptimWrapper optim_wrapper.fp32_modules=[bbox_head]"
            in head), summary
    log = (ROOT / "work_dirs/e2e/amp/logs/train_bf16_fp32head_seed0.log").read_text()
    assert "SelectiveAmpOptimWrapper (float16 mixed precision), which needs a CUDA GPU" in log
    assert summary.count("bbox_mAP_copypaste") == 1, summary  # fp32's, once at the end


@pytest.mark.parametrize("steps", ["3", "0"])
def test_warmup_derives_configs_with_that_warmup(steps, tmp_path):
    run = _run("amp", tmp_path, E2E_VARIANTS="fp32", E2E_WARMUP=steps)
    summary = (tmp_path / "amp.log").read_text()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    train = _steps(summary)["train_fp32_seed0"]
    assert " rc=0 " in train and f"configs/dino_tiny_cpu_warmup{steps}.py" in train, summary
    # The config the run used (mmengine dumps it): the MultiStepLR first,
    # rescheduled by the part's options, then the warmup (none for 0).
    from mmengine.config import Config
    (dumped,) = (ROOT / "work_dirs/e2e/amp/syn_fp32_seed0").glob(f"dino_tiny_cpu_warmup{steps}.py")
    multistep, *warmup = Config.fromfile(str(dumped)).param_scheduler
    assert (multistep.type, multistep.end, multistep.milestones) == ("MultiStepLR", 2, [1])
    assert [(w.type, w.by_epoch, w.end) for w in warmup] == (
        [("LinearLR", False, 3)] if steps == "3" else [])


@pytest.mark.parametrize("warmup", ["200 steps", "010", "-5", "", "1234567890"])
def test_bad_warmup_is_refused(warmup, tmp_path):
    run = _run("amp", tmp_path, timeout=60, E2E_WARMUP=warmup)
    assert run.returncode == 2 and "E2E_WARMUP must be a number of steps" in run.stderr
    assert not (tmp_path / "amp.log").exists()


def test_bad_options_on_the_command_line_are_refused(tmp_path):
    run = _run("amp", tmp_path, "--warmup", "010", "--variants", "fp32", timeout=60)
    assert run.returncode == 2 and "--warmup/E2E_WARMUP must be a number of steps" in run.stderr
    assert not (tmp_path / "amp.log").exists()


def test_warmup_configs_copy_the_synthetic_configs_multistep_lr():
    # The derived configs restate param_scheduler[0]; it must stay the one
    # the synthetic configs (and the tiny smoke config) have.
    from mmengine.config import Config
    written = _plan()["MULTISTEP_LR"]
    for name in ("dino_r50_synthetic_bf16.py", "dino_r50_synthetic_fp32.py"):
        base = Config.fromfile(str(ROOT / "configs/synthetic" / name)).param_scheduler[0]
        assert dict(base) == written, name


def test_ap_part_warns_when_runs_share_a_gpu(tmp_path):
    # Two runs on one GPU; a zero budget skips every step after the warning.
    run = _run("ap", tmp_path, gpus="0", timeout=120, E2E_VARIANTS="bf16 fp32",
               E2E_BUDGET_S="0")
    assert "warning: 2 ap runs on 1 GPU(s)" in run.stderr, run.stderr[-2000:]


@pytest.mark.parametrize("variants, message", [("bf16 fp8", "unknown variant 'fp8'"),
                                               ("bf16_fp32heads", "bf16_noscale, "),
                                               ("bf16 fp32 bf16", "'bf16' given twice")])
def test_bad_variants_are_refused(variants, message, tmp_path):
    run = _run("seeds", tmp_path, timeout=60, E2E_VARIANTS=variants)
    assert run.returncode == 2
    assert message in run.stderr
    assert not (tmp_path / "seeds.log").exists()


def test_ddp_part_needs_two_gpus(tmp_path):
    run = _run("ddp", tmp_path, gpus="0", timeout=60)
    assert run.returncode == 2
    assert "needs 2 GPUs, found 1" in run.stderr
    assert not (tmp_path / "ddp.log").exists()


def test_every_keep_fp32_variant_names_submodules_of_dino():
    # The amp part's variants are module paths handed to keep_fp32 on a GPU:
    # a typo would only show there, after the machine's start.
    from mmengine.config import Config

    from msda_mm.engine import keep_fp32

    from plugin.detr_configs import build_detector

    variants = _plan()["KEEP_FP32"]
    assert {"bf16_fp32head", "bf16_fp32transformer", "bf16_fp32cnnhead",
            "bf16_fp32all"} <= set(variants)
    model = build_detector(Config.fromfile(str(ROOT / "configs/synthetic/dino_tiny_cpu.py")).model)
    for paths in variants.values():
        for handle in keep_fp32(model, paths.split(",")):
            handle.remove()
    # The control keeps every submodule in fp32: none may be left in bf16.
    # Not the data preprocessor: mmengine runs it under autocast too, but it
    # only normalises and pads (elementwise ops, which autocast leaves fp32).
    assert set(variants["bf16_fp32all"].split(",")) == {
        name for name, _ in model.named_children() if name != "data_preprocessor"}


def _running(stat: Path) -> bool:
    """The process of /proc/PID/stat neither gone nor dead (a zombie its new
    parent has not reaped yet)."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_step_is_stopped_with_its_children_at_its_deadline(tmp_path):
    steps_module = runpy.run_path(str(ROOT / "tools" / "e2e_steps.py"))
    summary = steps_module["Summary"](tmp_path / "part.log")
    deadline = time.monotonic() + steps_module["MIN_STEP_S"] + 1
    steps = steps_module["Steps"](tmp_path, summary, deadline, dict(os.environ))
    child = tmp_path / "child.pid"
    # The sleep is not the step's own process: the whole group must go.
    rc = steps.run("slow", 0, ["bash", "-c", f"sleep 300 & echo $! > {child}; wait"])
    assert rc == 124
    stat = Path(f"/proc/{int(child.read_text())}/stat")
    waited = time.monotonic() + 5  # for its exit: the signal is sent, not yet acted on
    while _running(stat) and time.monotonic() < waited:
        time.sleep(0.05)
    assert not _running(stat)
    assert steps.run("late", 0, ["true"]) is None
    lines = summary.path.read_text().splitlines()
    assert lines[0].startswith("slow") and " rc=124 " in lines[0]
    assert lines[1].startswith("late") and " skipped (" in lines[1]
