"""The steps of each part of tools/run_e2e.py (its docstring says what they
run), as calls of the project's tools; ``PARTS`` maps a part to its steps and
to the pattern of its headline lines."""
from __future__ import annotations

import os
import sys
from functools import partial
from itertools import product
from pathlib import Path

from e2e_plan import VARIANTS, Plan, first_evaluation
from e2e_steps import Steps, lanes, side_by_side

PYTHON = os.environ.get("E2E_PYTHON") or sys.executable  # see tools/run_e2e.py


def prepare_data(plan: Plan, steps: Steps, *sizes: str) -> None:
    """The synthetic data of the bf16 config and of the profiles' ``sizes``
    (HxW), written once up front: the lanes neither race for them nor time
    their drawing."""
    steps.run("prepare_data", 0, [PYTHON, "tools/prepare_data.py", *sizes,
                                  plan.synthetic["bf16"]])


def train_args(plan: Plan, work_dir: Path, *options: str) -> list[str]:
    """tools/train.py's options (after CONFIG) for a synthetic training."""
    return ["--work-dir", str(work_dir), "--cfg-options", *plan.train_options, *options]


def train_command(plan: Plan, config: str, work_dir: Path, *options: str) -> list[str]:
    return [PYTHON, "tools/train.py", config, *train_args(plan, work_dir, *options)]


def last_checkpoint(work_dir: Path) -> str | None:
    path = work_dir / "last_checkpoint"
    return path.read_text().strip() if path.is_file() else None


def profile_one(plan: Plan, steps: Steps, config: str, name: str, batch: int,
                reserve_s: int) -> None:
    """tools/profile_step.py of ``config`` at the plan's size."""
    steps.run(f"profile_b{batch}_{name}", reserve_s, [
        PYTHON, "tools/profile_step.py", config, "--image-size", *map(str, plan.size),
        "--batch-size", str(batch), "--out", str(plan.res / f"b{batch}_{name}"),
        *plan.profile_options])


# train: the synthetic training in each precision, then the COCO profiles in
# the time left in its lane (beside the other lane's training).
def train_bf16(plan: Plan, steps: Steps) -> None:
    config = plan.synthetic["bf16"]
    # 150 s kept for the parity eval: two passes over the 100 val images.
    steps.run("train_bf16", 150, train_command(plan, config, plan.res / "syn_bf16"))
    checkpoint = last_checkpoint(plan.res / "syn_bf16")
    if checkpoint is None:
        steps.summary.add("parity_eval: no checkpoint")
        return
    steps.run("parity_eval", 0, [PYTHON, "tools/parity.py", "eval", config, checkpoint,
                                 "--out", str(plan.res / "parity_eval"), *plan.eval_options])
    profile_one(plan, steps, plan.coco["bf16"], "bf16", plan.batches[-1], 0)


def train_fp32(plan: Plan, steps: Steps) -> None:
    steps.run("train_fp32", 0, train_command(plan, plan.synthetic["fp32"], plan.res / "syn_fp32"))
    profile_one(plan, steps, plan.coco["bf16"], "bf16", plan.batches[0], 0)
    profile_one(plan, steps, plan.coco["fp32"], "fp32", plan.batches[0], 0)
    profile_one(plan, steps, plan.coco["fp32"], "fp32", plan.batches[-1], 0)


def train(plan: Plan, steps: Steps) -> None:
    prepare_data(plan, steps, "x".join(map(str, plan.size)))
    lanes(steps, plan.gpus, partial(train_bf16, plan), partial(train_fp32, plan))


# profile: a lane per precision, each keeping ~150 s for each step after it.
def profile_lane(plan: Plan, precision: str, parity: str, options: tuple[str, ...],
                 steps: Steps) -> None:
    """The COCO config's profiles at both batch sizes, then the parity
    training PARITY of the synthetic bf16 config with ``options``."""
    for i, batch in enumerate(plan.batches):
        profile_one(plan, steps, plan.coco[precision], precision, batch,
                    150 * (len(plan.batches) - i))
    steps.run(f"parity_train_{parity}", 0, [
        PYTHON, "tools/parity.py", "train", plan.synthetic["bf16"],
        "--iters", str(plan.parity_iters), "--out", str(plan.res / f"parity_train_{parity}"),
        *(("--cfg-options", *options) if options else ())])


def profile(plan: Plan, steps: Steps) -> None:
    prepare_data(plan, steps, "x".join(map(str, plan.size)))
    lanes(steps, plan.gpus, partial(profile_lane, plan, "fp32", "native", ()),
          partial(profile_lane, plan, "bf16", "fp32accum", VARIANTS["bf16_fp32accum"]))


# seeds, ap, amp: every (variant, seed) training at once, GPUs round-robin.
def seed_runs(plan: Plan, steps: Steps) -> None:
    prepare_data(plan, steps)
    runs = list(product(plan.seeds, plan.variants))
    gpus = plan.gpus or (None,)
    side_by_side([partial(seed_run, plan, steps.on_gpu(gpus[i % len(gpus)]), variant, seed)
                  for i, (seed, variant) in enumerate(runs)])


def seed_run(plan: Plan, steps: Steps, variant: str, seed: int) -> None:
    """One training; in the ap part a bf16 run then gets tools/parity.py
    grads and kernels on its first checkpoint (the loss plateau where bf16
    runs without a warmup lagged), with the op as the run trained it, ~30 s
    each, kept back from the training."""
    config = plan.synthetic["fp32" if variant == "fp32" else "bf16"]
    work = plan.res / f"syn_{variant}_seed{seed}"
    checks = plan.part == "ap" and variant != "fp32"
    options = VARIANTS[variant]
    steps.run(f"train_{variant}_seed{seed}", 90 if checks else 0, train_command(
        plan, config, work, f"randomness.seed={seed}",
        f"train_dataloader.num_workers={plan.workers}", *options))
    if not checks:
        return
    if variant == "bf16_fp32compute":  # the op on bf16 values, as configured without it
        options = ()
    checkpoint = work / f"epoch_{first_evaluation(plan.epochs)}.pth"
    if not checkpoint.is_file():
        steps.summary.add(f"checks_{variant}_seed{seed}   skipped (no {checkpoint})")
        return
    for check, reserve_s in (("grads", 40), ("kernels", 0)):
        steps.run(f"{check}_{variant}_seed{seed}", reserve_s, [
            PYTHON, "tools/parity.py", check, config, "--checkpoint", str(checkpoint),
            "--seed", str(seed), "--out", str(work / f"parity_{check}"),
            "--cfg-options", *plan.train_options, *options])


# ddp: the 2-GPU training, its one-GPU twins and the tests of its checkpoint.
def single_run(plan: Plan, seed: int, steps: Steps) -> None:
    steps.run(f"single_seed{seed}", 110, train_command(
        plan, plan.synthetic["bf16"], plan.res / f"single_seed{seed}", f"randomness.seed={seed}"))


def ddp(plan: Plan, steps: Steps) -> None:
    config = plan.synthetic["bf16"]
    prepare_data(plan, steps)
    steps.run("multigpu_test", 0, [PYTHON, "-m", "pytest", "-q", "-rs", "-m", "multigpu",
                                   "tests/ops/test_msda_gpu.py"])
    steps.run("ddp_train", 280, ["bash", "tools/dist_train.sh", config, "2",
                                 *train_args(plan, plan.res / "ddp_2gpu",
                                             "train_dataloader.batch_size=4")], PYTHON=PYTHON)
    lanes(steps, plan.gpus, partial(single_run, plan, 0), partial(single_run, plan, 1))
    checkpoint = last_checkpoint(plan.res / "ddp_2gpu")
    if checkpoint is None:
        steps.summary.add("tests: no checkpoint")
        return
    steps.run("test_2gpu", 60, ["bash", "tools/dist_test.sh", config, checkpoint, "2",
                                "--work-dir", str(plan.res / "test_2gpu")], PYTHON=PYTHON)
    steps.run("test_1gpu", 20, [PYTHON, "tools/test.py", config, checkpoint,
                                "--work-dir", str(plan.res / "test_1gpu")])
    steps.run("compare_runs", 0, [
        PYTHON, "tools/compare_runs.py", f"single_seed0={plan.res / 'single_seed0'}",
        f"ddp_2gpu={plan.res / 'ddp_2gpu'}", f"single_seed1={plan.res / 'single_seed1'}",
        "--out", str(plan.res / "compare"),
        "--title", "DINO R50 synthetic bf16: 2 GPUs x 4 images vs 1 GPU x 8"])


SEED_HEADLINES = (r"bbox_mAP_copypaste|^  loss: |^    (floor|fp32_compute|bf16_value) "
                  r"|^(PASS|FAIL): |^No op call")
PARTS = {
    "train": (train, r"bbox_mAP_copypaste|^coco/bbox_mAP |^(PASS|FAIL)|^\| [0-9]"),
    "profile": (profile, r"^\| [0-9]|max relative difference"),
    "seeds": (seed_runs, SEED_HEADLINES),
    "ap": (seed_runs, SEED_HEADLINES),
    "amp": (seed_runs, SEED_HEADLINES),
    "ddp": (ddp, r"bbox_mAP_copypaste|[0-9]+ (passed|failed|skipped)|vs single_seed0"),
}
