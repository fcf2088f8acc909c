"""tools/run_e2e.py, the driver behind the committed H200 end-to-end
results, in its CPU smoke mode (E2E_SMOKE=1: the tiny config, a few steps).
Two parts run for real: every step of `train`, and `ap`, whose checks read
the checkpoint its training saved.  The other parts' steps are listed
(E2E_PYTHON=true runs none), and the config each of their trainings gets is
loaded here as tools/train.py loads it."""
import os
import runpy
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")  # the model builds

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
TOOL = TOOLS / "run_e2e.py"


def _run(part, out, *options, gpus="", timeout=600, **env):
    """run_e2e.py PART OUT OPTIONS in smoke mode with CUDA_VISIBLE_DEVICES=gpus,
    the runs in OUT/work_dirs (tests of one part run side by side) and the
    E2E_* settings given (none inherited); the tool sets TRITON_INTERPRET
    itself."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("E2E_") and k != "TRITON_INTERPRET"}
    environ.update(env, E2E_SMOKE="1", CUDA_VISIBLE_DEVICES=gpus,
                   E2E_WORK_DIRS=str(out / "work_dirs"))
    return subprocess.run([sys.executable, str(TOOL), part, str(out), *options], env=environ,
                          capture_output=True, text=True, timeout=timeout)


def _plan():
    """tools/e2e_plan.py's globals: the variants and schedules."""
    return runpy.run_path(str(TOOLS / "e2e_plan.py"))


def _steps(summary: str) -> dict[str, str]:
    """Each step's summary line, by step name."""
    return {line.split()[0]: line for line in summary.splitlines() if " rc=" in line}


def _listed(part, out, *options, **env) -> tuple[dict[str, str], str]:
    """The part's steps with E2E_PYTHON=true (listed, none run): each one's
    summary line by step name, and the summary."""
    run = _run(part, out, *options, timeout=120, E2E_PYTHON="true", **env)
    summary = (out / f"{part}.log").read_text()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return _steps(summary), summary


@pytest.fixture
def train_config(monkeypatch):
    """What tools/train.py makes of a train step's summary line up to its
    Runner (mmengine's, which dumps that config): the config, with the
    command line applied, and the precision check (a SystemExit with the
    tool's message where it stops)."""
    monkeypatch.syspath_prepend(str(TOOLS))
    monkeypatch.setenv("LOCAL_RANK", "0")  # what load_config would set
    monkeypatch.chdir(ROOT)  # the steps' paths are the checkout's
    train = runpy.run_path(str(TOOLS / "train.py"))

    def load(line: str):
        args = train["parse_args"](shlex.split(line.split(" tools/train.py ", 1)[1]))
        cfg = train["load_config"](args)
        train["apply_train_args"](cfg, args)
        train["check_precision"](cfg, args.config)
        return cfg

    return load


def _evaluations(cfg) -> list[int]:
    """The epochs after which mmengine's EpochBasedTrainLoop validates: every
    val_interval-th and the last."""
    loop = cfg.train_cfg
    return [epoch for epoch in range(1, loop.max_epochs + 1)
            if epoch % loop.val_interval == 0 or epoch == loop.max_epochs]


def _check_schedulers(schedulers, warmup: int) -> None:
    """The MultiStepLR first, rescheduled by the part's options to the smoke
    run's 2 epochs, then the linear warmup over ``warmup`` steps (none for 0)."""
    multistep, *linear = schedulers
    assert (multistep.type, multistep.end, multistep.milestones) == ("MultiStepLR", 2, [1])
    assert [(w.type, w.by_epoch, w.end) for w in linear] == (
        [("LinearLR", False, warmup)] if warmup else [])


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
    # Each training validated halfway and at the end (the seeds part's schedule too).
    results = summary.split("# results", 1)[1].splitlines()
    for log in ("train_bf16.log:", "train_fp32.log:"):
        assert sum(line.startswith(log) and "bbox_mAP_copypaste" in line
                   for line in results) == 2, summary


def test_seeds_part_trains_each_variant_per_seed(tmp_path, train_config):
    # The command line's options, where the other tests set E2E_*.
    steps, summary = _listed("seeds", tmp_path, "--seeds", "3", "--variants", "fp32",
                             "bf16_fp32accum")
    assert set(steps) == {"prepare_data", "train_fp32_seed3", "train_bf16_fp32accum_seed3"}, summary
    assert "randomness.seed=3" in steps["train_fp32_seed3"], summary
    assert "fp32_grad_accum" not in steps["train_fp32_seed3"], summary
    assert "self_attn_cfg.fp32_grad_accum=True" in steps["train_bf16_fp32accum_seed3"], summary
    from msda_mm.models import TritonMSDeformAttn

    from plugin.detr_configs import build_detector

    for name, accum in (("train_fp32_seed3", None), ("train_bf16_fp32accum_seed3", True)):
        cfg = train_config(steps[name])
        assert cfg.randomness.seed == 3
        # The train part's schedule: 2 evaluations a run (its real run counts them).
        assert _evaluations(cfg) == [1, 2], summary
        attention = [module for module in build_detector(cfg.model).modules()
                     if isinstance(module, TritonMSDeformAttn)]
        assert len(attention) == 6 and all(m.fp32_grad_accum is accum for m in attention), name


def test_ap_part_runs_the_batch16_ap_schedule(tmp_path):
    # The batch-16 schedule with the host cut, on the variant that runs the
    # op in fp32 under bf16 AMP; seed 0 unless E2E_SEEDS; then the gradient
    # comparison and the kernel check of a bf16 variant.  With a 3-step
    # warmup: the derived config trains, and the checks read it too.
    run = _run("ap", tmp_path, E2E_VARIANTS="bf16_fp32compute", E2E_WARMUP="3")
    summary = (tmp_path / "ap.log").read_text()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = _steps(summary)
    assert set(steps) == {"prepare_data", "train_bf16_fp32compute_seed0",
                          "grads_bf16_fp32compute_seed0", "kernels_bf16_fp32compute_seed0"}, summary
    derived = "configs/dino_tiny_cpu_warmup3.py"
    assert all(derived in line for line in steps.values()), summary
    # The smoke config is fp32: the kernel check finds no bf16 call (exit 4).
    kernels = steps.pop("kernels_bf16_fp32compute_seed0")
    assert " rc=4 " in kernels and "parity.py kernels" in kernels, summary
    assert "epoch_2.pth" in kernels and "fp32_compute=True" not in kernels, summary
    assert all(" rc=0 " in line for line in steps.values()), summary
    line = steps["train_bf16_fp32compute_seed0"]
    # The config the run used (mmengine dumps it).
    from mmengine.config import Config
    work = tmp_path / "work_dirs/ap/syn_bf16_fp32compute_seed0"
    _check_schedulers(Config.fromfile(str(work / Path(derived).name)).param_scheduler, 3)
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


def test_amp_part_runs_the_first_epochs_of_the_ap_schedule(tmp_path, train_config):
    # On CPU train.py refuses the AMP variants (SelectiveAmpOptimWrapper needs
    # CUDA): their command lines are what is checked; fp32 trains (the ap
    # test trains on the same schedule before the cut).
    steps, summary = _listed("amp", tmp_path, E2E_VARIANTS="fp32 bf16_fp32head")
    assert set(steps) == {"prepare_data", "train_fp32_seed0", "train_bf16_fp32head_seed0"}, summary
    fp32, head = steps["train_fp32_seed0"], steps["train_bf16_fp32head_seed0"]
    for option in ("train_dataloader.batch_size=16", "param_scheduler.0.milestones=[1]",
                   "train_cfg.max_epochs=3", "train_cfg.val_interval=1000",
                   "checkpoint.save_last=False"):
        assert option in fp32 and option in head, summary
    # The cut comes after the schedule's own max_epochs, so it wins.
    assert fp32.index("train_cfg.max_epochs=2") < fp32.index("train_cfg.max_epochs=3"), summary
    assert "SelectiveAmpOptimWrapper" not in fp32, summary
    # E2E_WARMUP unset: the config itself (its own schedule), none derived.
    assert "tools/train.py configs/synthetic/dino_tiny_cpu.py " in fp32, summary
    assert not (tmp_path / "work_dirs/amp/configs").exists()
    assert ("optim_wrapper.type=SelectiveAmpOptimWrapper optim_wrapper.fp32_modules=[bbox_head]"
            in head), summary
    assert _evaluations(train_config(fp32)) == [3], summary  # fp32's, once at the end
    with pytest.raises(SystemExit, match=r"SelectiveAmpOptimWrapper \(float16 mixed precision\), "
                                         "which needs a CUDA GPU"):
        train_config(head)


@pytest.mark.parametrize("steps", [3, 0])
def test_warmup_derives_configs_with_that_warmup(steps, tmp_path, train_config):
    listed, summary = _listed("amp", tmp_path, E2E_VARIANTS="fp32", E2E_WARMUP=str(steps))
    train = listed["train_fp32_seed0"]
    assert f"configs/dino_tiny_cpu_warmup{steps}.py" in train, summary
    # The config train.py hands the Runner (the ap test trains with warmup 3).
    _check_schedulers(train_config(train).param_scheduler, steps)


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


def test_a_step_is_stopped_with_its_children_at_its_deadline(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TOOLS))
    import e2e_steps

    # A step is skipped with less than MIN_STEP_S left: 2 s, for a short wait.
    monkeypatch.setattr(e2e_steps, "MIN_STEP_S", 2)
    summary = e2e_steps.Summary(tmp_path / "part.log")
    deadline = time.monotonic() + e2e_steps.MIN_STEP_S + 1
    steps = e2e_steps.Steps(tmp_path, summary, deadline, dict(os.environ))
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
