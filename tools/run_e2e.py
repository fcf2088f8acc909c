"""The end-to-end GPU results (benchmarks/e2e): one part per GPU job of at most 600 s.

    python tools/run_e2e.py {train,profile,seeds,ap,amp,ddp} OUT [--budget-s S]
        [--epochs N] [--amp-epochs N] [--warmup N] [--variants V ...] [--seeds S ...]
        [--smoke]

train:   DINO R50 on synthetic data in bf16, then tools/parity.py eval of its
         checkpoint, and its fp32 twin; then, in the time left in each lane,
         tools/profile_step.py of the COCO configs at 800 x 1333 (bf16 batch 8;
         batch 2 in both precisions, fp32 batch 8).
profile: tools/profile_step.py of the COCO configs at 800 x 1333, batch 2 and
         8, fp32 and bf16; tools/parity.py train in bf16 with the native
         grad_value atomics and with fp32 accumulation (the pre-Hopper path).
seeds:   the synthetic training of `train` once per variant and seed, all at
         once (GPUs round-robin): AP against seed-to-seed noise.
ap:      seeds' runs on the batch-16 schedule that trains DINO to AP 80-87
         (one run per GPU); each bf16 run then gets tools/parity.py grads and
         kernels on its first checkpoint.
amp:     the first --amp-epochs epochs of the ap schedule, evaluated once,
         for every variant at once: which part of bf16 AMP makes its loss lag fp32's.
ddp:     (2 GPUs) the multi-GPU op test; the synthetic bf16 training through
         tools/dist_train.sh on 2 GPUs x 4 images, and on one GPU x 8 images
         with seeds 0 and 1 (its noise); the 2-GPU checkpoint tested through
         tools/dist_test.sh and tools/test.py; tools/compare_runs.py of the three.

Every step runs under the deadline (--budget-s from the start, less what the
steps after it in its lane need) and is stopped there; the results are
packed before it.  Two lanes of steps, one per GPU (CUDA_VISIBLE_DEVICES,
else nvidia-smi); on one GPU one after the other.  The runs go to
work_dirs/e2e/PART (--work-dirs DIR: DIR/PART, cleared first).  Writes
OUT/PART.log (each step's exit code, seconds and command, then the headline
numbers) and OUT/PART.tar.gz (the runs without checkpoints).  Each option's
default is its E2E_* environment variable's (E2E_BUDGET_S, E2E_EPOCHS, ...,
E2E_SMOKE=1).  E2E_PYTHON is the interpreter every step runs (default: this
one); E2E_PYTHON=true lists a part's steps and commands without running them
(each exits 0 at once, so steps that read a checkpoint say it is missing).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path

from e2e_parts import PARTS
from e2e_plan import (
    VARIANTS,
    default_epochs,
    default_seeds,
    default_variants,
    make_plan,
    with_warmup,
)
from e2e_steps import Steps, Summary, headlines

ROOT = Path(__file__).resolve().parents[1]
# Plain decimal numbers of at most 9 digits: a leading 0 or a longer count is a typo.
NUMBER = re.compile(r"0|[1-9][0-9]{0,8}")


def from_env(variable: str) -> str | None:
    """An option's default: its environment variable, unless unset or empty."""
    return os.environ.get(variable) or None


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=f"variants: {', '.join(VARIANTS)} (see tools/e2e_plan.py)")
    parser.add_argument("part", choices=PARTS)
    parser.add_argument("out", type=Path, help="folder for PART.log and PART.tar.gz")
    parser.add_argument("--budget-s", metavar="S", default=from_env("E2E_BUDGET_S"),
                        help="seconds until the deadline (E2E_BUDGET_S; default 530, ap 560: "
                             "its fp32 run takes ~500 s)")
    parser.add_argument("--epochs", metavar="N", default=from_env("E2E_EPOCHS"),
                        help="epochs of every synthetic training, >= 2 (E2E_EPOCHS; default 4, "
                             "ap and amp 16, --smoke 2)")
    parser.add_argument("--amp-epochs", metavar="N", default=from_env("E2E_AMP_EPOCHS"),
                        help="amp: the epochs of the ap schedule trained (E2E_AMP_EPOCHS; "
                             "default 3)")
    # Set, even empty, E2E_WARMUP must be a number: unset keeps the configs' own warmup.
    parser.add_argument("--warmup", metavar="N", default=os.environ.get("E2E_WARMUP"),
                        help="steps of linear LR warmup of every synthetic training, 0 for none "
                             "(E2E_WARMUP; default: the synthetic configs' own 200)")
    parser.add_argument("--variants", nargs="+", metavar="V",
                        default=(from_env("E2E_VARIANTS") or "").split() or None,
                        help="seeds, ap, amp: the precision variants trained (E2E_VARIANTS; "
                             "default bf16 fp32, amp: bf16 fp32 bf16_noscale and every "
                             "bf16_fp32<submodules>)")
    parser.add_argument("--seeds", nargs="+", metavar="S",
                        default=(from_env("E2E_SEEDS") or "").split() or None,
                        help="seeds, ap, amp: the seeds of each variant (E2E_SEEDS; default "
                             "0 1, ap and amp 0)")
    parser.add_argument("--work-dirs", metavar="DIR", type=Path,
                        default=from_env("E2E_WORK_DIRS"),
                        help="the runs go to DIR/PART, cleared first (E2E_WORK_DIRS; default "
                             "work_dirs/e2e in the checkout)")
    parser.add_argument("--smoke", action="store_true",
                        default=os.environ.get("E2E_SMOKE") == "1",
                        help="the tiny CPU config and a few steps: a check without a GPU "
                             "(E2E_SMOKE=1)")
    args = parser.parse_args(argv)

    def number(text: str | None, name: str, what: str, default: int | None = None,
               minimum: int = 0) -> int | None:
        if text is None:
            return default
        if not NUMBER.fullmatch(text) or int(text) < minimum:
            parser.error(f"{name} must be {what}, got {text!r}")
        return int(text)

    part = args.part
    args.budget_s = number(args.budget_s, "--budget-s/E2E_BUDGET_S", "a number of seconds",
                           560 if part == "ap" else 530)
    args.epochs = number(args.epochs, "--epochs/E2E_EPOCHS", "a number of epochs >= 2",
                         default_epochs(part, args.smoke), minimum=2)
    args.amp_epochs = number(args.amp_epochs, "--amp-epochs/E2E_AMP_EPOCHS",
                             "a number of epochs >= 1", 3, minimum=1)
    args.warmup = number(args.warmup, "--warmup/E2E_WARMUP", "a number of steps")
    args.seeds = tuple(number(seed, "--seeds/E2E_SEEDS", "numbers") for seed in args.seeds or ()
                       ) or default_seeds(part)
    args.variants = tuple(args.variants or default_variants(part))
    for i, variant in enumerate(args.variants):
        if variant not in VARIANTS:
            parser.error(f"--variants/E2E_VARIANTS: unknown variant {variant!r} "
                         f"({', '.join(VARIANTS)})")
        # Two runs of one variant and seed would share a work_dir.
        if variant in args.variants[:i]:
            parser.error(f"--variants/E2E_VARIANTS: {variant!r} given twice")
    return args


def visible_gpus() -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES, else nvidia-smi's GPUs, else torch's."""
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        return tuple(os.environ["CUDA_VISIBLE_DEVICES"].split(","))
    for command in (["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                    [sys.executable, "-c",
                     "import torch; [print(i) for i in range(torch.cuda.device_count())]"]):
        try:
            listed = subprocess.run(command, capture_output=True, text=True)
        except FileNotFoundError:
            continue
        if listed.returncode == 0:
            return tuple(listed.stdout.split())
    return ()


def header(args: argparse.Namespace, gpus: tuple[str, ...]) -> list[str]:
    """The summary's first lines: the part, its time and settings, the GPUs."""
    lines = [f"# {args.part}, {datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}, "
             f"GPUs: {' '.join(gpus) or 'none'}, smoke: {int(args.smoke)}, "
             f"epochs: {args.epochs}"]
    try:
        lines += subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                                text=True).stdout.splitlines()
    except FileNotFoundError:
        pass
    return lines


def pack(res: Path, summary: Summary, pattern: str, tarball: Path) -> None:
    """The headline lines (``pattern``) under '# results' in the summary, a
    copy of it in ``res``, and ``res`` without checkpoints in ``tarball``."""
    summary.add("# results")
    for line in headlines(res / "logs", pattern):
        summary.add(line)
    (res / summary.path.name).write_text(summary.path.read_text())
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(res, arcname=res.name,
                filter=lambda member: None if member.name.endswith(".pth") else member)


def main(argv=None) -> int:
    args = parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    gpus = visible_gpus()
    if args.part == "ddp" and len(gpus) < 2:
        print(f"run_e2e.py: the ddp part needs 2 GPUs, found {len(gpus)}", file=sys.stderr)
        return 2
    out = args.out.resolve()
    res = (args.work_dirs.resolve() if args.work_dirs else Path("work_dirs/e2e")) / args.part
    os.chdir(ROOT)  # the tools' and configs' paths are the repository's
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(res, ignore_errors=True)
    (res / "logs").mkdir(parents=True)
    summary = Summary(out / f"{args.part}.log")
    plan = make_plan(args.part, res, gpus, args.variants, args.seeds, args.epochs,
                     args.amp_epochs, args.smoke)
    if args.warmup is not None:
        plan = with_warmup(plan, args.warmup)
    for line in header(args, gpus):
        summary.add(line)
    runs = len(plan.variants) * len(plan.seeds)
    if args.part == "ap" and runs > max(len(gpus), 1):
        warning = (f"warning: {runs} ap runs on {len(gpus)} GPU(s): they share them, "
                   "and the schedule was timed one run per GPU")
        summary.add(warning)
        print(warning, file=sys.stderr)

    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if args.smoke:  # CPU: the PyTorch reference, as the tests run it
        env.update(TRITON_INTERPRET="0", OMP_NUM_THREADS="1")
    run_part, pattern = PARTS[args.part]
    tarball = out / f"{args.part}.tar.gz"
    try:
        run_part(plan, Steps(res / "logs", summary, deadline, env))
    finally:
        pack(res, summary, pattern, tarball)
        print(f"wrote {tarball} ({tarball.stat().st_size / 2**20:.1f} MiB), {summary.path}")
        print(summary.path.read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
