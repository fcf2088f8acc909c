"""Whether a replayed training step is the eager step over a real run:
GraphedDINO beside its eager twin (the same model, never captured), the twin
set to the graphed model's state before every step.

    python research/graphed_drift.py CONFIG [--steps 300] [--seconds S]
        [--warmup-iters 200] [--lr-drop-at K] [--eval-at K ...] [--eval-batches 10]
        [--burst 1] [--out DIR] [--cfg-options k=v ...]

At each step the graphed model runs the step (each shape's first steps
eager, then captured, then replayed), its starting parameters, buffers,
optimizer state and CUDA generator state kept; the twin, set to that state,
runs the step eagerly, then again from the same state (the floor: what the
atomic sums' order alone changes).  Per step: each side's logged losses and
gradient norm, and the distance between the parameter updates, graphed
against eager and eager against eager again, in all and per parameter, and
between the float buffers' changes (BN's running statistics, which only an
evaluation reads) likewise, and, signed, how much further or shorter than
the eager update the graphed one goes along it (a bias keeps one sign).  A
replay that computed another step stands above the floor; one that computes
the same step up to rounding stays at it.  The graphed model trains on from
its own state, so the steps follow a run from its start; the learning rate
follows a linear warm-up over --warmup-iters steps from 0.001 of the
config's (the synthetic configs' LinearLR) and drops by 10 at --lr-drop-at
(the MultiStepLR's drop, earlier), so that a change of rate between replays
is covered, and with --eval-at the graphed model predicts validation batches
between two steps, eagerly, as a run's validation does.  With --burst K the
graphed model takes K steps one right behind the other, nothing waiting on
the device between them (a run that logs every K steps lets its host run
that far ahead), and the twin then steps from each kept state.  drift.json
is rewritten after every burst: a stopped run keeps the steps compared.  On
CPU both sides run eagerly (tests).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import common  # noqa: E402

WINDOW = 50  # steps per row of the summary
# A row's distances between the sides' changes of the parameters and the buffers.
DISTANCES = ("update_graphed_vs_eager", "buffers_graphed_vs_eager", "update_eager_vs_eager",
             "buffers_eager_vs_eager")
# A row's signed excess of each side's update along the eager one's (relative_along).
ALONG = ("update_along_graphed", "update_along_eager")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_config_args(parser, default_out="graphed_drift")
    parser.add_argument("--steps", type=common.positive_int, default=300, metavar="N",
                        help="training steps compared (default 300)")
    parser.add_argument("--seconds", type=float, default=math.inf, metavar="S",
                        help="stop after this many seconds of steps (default: none)")
    parser.add_argument("--warmup-iters", type=int, default=200, metavar="N",
                        help="steps of linear learning-rate warm-up from 0.001 (default 200)")
    parser.add_argument("--lr-drop-at", type=common.positive_int, metavar="K",
                        help="step from which the learning rate is a tenth (default: none)")
    parser.add_argument("--eval-at", type=common.positive_int, nargs="+", default=[],
                        metavar="K", help="steps before which the graphed model predicts "
                        "--eval-batches batches of the validation data, as a run's "
                        "validation does between epochs (default: none)")
    parser.add_argument("--eval-batches", type=common.positive_int, default=10, metavar="N",
                        help="validation batches each --eval-at predicts (default 10)")
    parser.add_argument("--burst", type=common.positive_int, default=1, metavar="K",
                        help="graphed steps taken one right behind the other, then compared "
                        "(default 1; a run logging every K steps lets the host run K steps "
                        "ahead of the device)")
    args = parser.parse_args(argv)
    if args.warmup_iters < 0:
        parser.error(f"--warmup-iters must be >= 0, got {args.warmup_iters}")
    return args


def lr_factor(step: int, warmup_iters: int, drop_at) -> float:
    """The learning rate at ``step`` over the config's: mmengine's LinearLR
    from 0.001 over ``warmup_iters`` steps, a tenth from ``drop_at`` on."""
    factor = 1.0 if step >= warmup_iters else 0.001 + 0.999 * step / warmup_iters
    return factor * (0.1 if drop_at is not None and step >= drop_at else 1.0)


def twin_model(runner, cfg):
    """The runner's GraphedDINO built again, never captured, with its weights."""
    from mmdet.registry import MODELS

    model = MODELS.build(dict(copy.deepcopy(cfg.model), warmup_steps=10 ** 9, log_interval=1))
    model.load_state_dict(runner.model.state_dict())
    return model.to(next(runner.model.parameters()).device).train()


def compiled_paths(cfg) -> list:
    """The submodules the config's CompileSubmodulesHook compiles."""
    return [path for hook in cfg.get("custom_hooks", [])
            if hook.get("type") == "CompileSubmodulesHook" for path in hook["modules"]]


def validate(model, runner, cfg, num_batches: int) -> None:
    """``num_batches`` batches of the config's validation data predicted by
    ``model`` in eval mode, as mmengine's ValLoop predicts them."""
    import torch

    loader = runner.build_dataloader(copy.deepcopy(cfg.val_dataloader))
    model.eval()
    with torch.no_grad():
        for _, data in zip(range(num_batches), loader):
            model.val_step(data)
    model.train()


def per_parameter(update, reference, sizes):
    """Each parameter's ||update - reference|| / ||reference||."""
    import torch

    pairs = zip(update.split(sizes), reference.split(sizes))
    return torch.stack([(u - r).norm() / r.norm().clamp_min(1e-30) for u, r in pairs])


def summarize(rows: list, names: list, graphed_err, floor_err) -> dict:
    """Per window of steps, the medians of the distances and of the
    graphed-to-eager gradient-norm ratio (and the floor's), the means of the
    signed excesses along the eager update; the parameters
    whose mean graphed distance is furthest above their mean floor."""
    windows = []
    for start in range(0, len(rows), WINDOW):
        part = rows[start:start + WINDOW]
        windows.append(dict(
            steps=[part[0]["step"], part[-1]["step"]],
            update_graphed_vs_eager=statistics.median(r["update_graphed_vs_eager"] for r in part),
            update_eager_vs_eager=statistics.median(r["update_eager_vs_eager"] for r in part),
            buffers_graphed_vs_eager=statistics.median(
                r["buffers_graphed_vs_eager"] for r in part),
            buffers_eager_vs_eager=statistics.median(r["buffers_eager_vs_eager"] for r in part),
            update_along_graphed=statistics.mean(r["update_along_graphed"] for r in part),
            update_along_eager=statistics.mean(r["update_along_eager"] for r in part),
            grad_norm_graphed_over_eager=statistics.median(
                r["graphed"]["grad_norm"] / r["eager"]["grad_norm"] for r in part),
            grad_norm_eager_over_eager=statistics.median(
                r["eager_again"]["grad_norm"] / r["eager"]["grad_norm"] for r in part),
            loss_graphed_over_eager=statistics.median(
                r["graphed"]["loss"] / r["eager"]["loss"] for r in part)))
    ratio = (graphed_err / len(rows)) / (floor_err / len(rows)).clamp_min(1e-12)
    order = ratio.argsort(descending=True)[:10].tolist()
    return dict(windows=windows, parameters_furthest_above_floor=[
        dict(name=names[i], mean_graphed_vs_eager=float(graphed_err[i]) / len(rows),
             mean_eager_vs_eager=float(floor_err[i]) / len(rows)) for i in order])


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = common.load_config(common.config_namespace(args))
    cfg.model.log_interval = args.burst
    from mmengine.optim import build_optim_wrapper

    from msda_mm.engine import compile_submodules
    from msda_mm.parity import training

    runner = common.build_runner(cfg)
    training.init_weights(runner, cfg)
    graphed = runner.model
    twin = twin_model(runner, cfg)
    ours, batches = training.start(runner, cfg, seed=runner.seed)
    theirs = build_optim_wrapper(twin, copy.deepcopy(cfg.optim_wrapper))
    for model in (graphed, twin):
        compile_submodules(model, compiled_paths(cfg))
    run = Run(args, runner, cfg, graphed, ours, twin, theirs)
    out = Path(args.out)  # config_namespace filled it in
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for first in range(0, args.steps - args.burst + 1, args.burst):
        if time.perf_counter() - start > args.seconds:
            break
        kept = run.graphed_steps([(step, next(batches)) for step in
                                  range(first, first + args.burst)])
        for row in run.compared(kept):
            print(f"step {row['step']}: update graphed/eager "
                  f"{row['update_graphed_vs_eager']:.3g}, eager/eager "
                  f"{row['update_eager_vs_eager']:.3g}; along the eager update "
                  f"{row['update_along_graphed']:+.3g} / {row['update_along_eager']:+.3g}; "
                  f"grad norm "
                  f"{row['graphed']['grad_norm']:.4g} / {row['eager']['grad_norm']:.4g} / "
                  f"{row['eager_again']['grad_norm']:.4g}", flush=True)
        report = dict(config=args.config, steps=len(run.rows), burst=args.burst,
                      seconds=time.perf_counter() - start, warmup_iters=args.warmup_iters,
                      lr_drop_at=args.lr_drop_at, eval_at=args.eval_at,
                      summary=summarize(run.rows, run.names, run.graphed_err, run.floor_err),
                      rows=run.rows)
        (out / "drift.json").write_text(json.dumps(report, indent=1))
    return 0


class Run:
    """The graphed model and its eager twin, stepped as main() says."""

    def __init__(self, args, runner, cfg, graphed, ours, twin, theirs) -> None:
        import torch

        from msda_mm.parity.training import state_names

        self.args, self.runner, self.cfg = args, runner, cfg
        self.graphed, self.ours, self.twin, self.theirs = graphed, ours, twin, theirs
        self.base = [group["lr"] for group in ours.optimizer.param_groups]
        self.flat_names = state_names(graphed)
        self.names = self.flat_names[0]
        self.sizes = [p.numel() for p in graphed.parameters()]
        cuda = next(graphed.parameters()).is_cuda
        self.get_generator = torch.cuda.get_rng_state if cuda else torch.get_rng_state
        self.set_generator = torch.cuda.set_rng_state if cuda else torch.set_rng_state
        self.rows: list = []
        self.graphed_err = self.floor_err = 0.0

    def set_lr(self, wrapper, step: int) -> float:
        factor = lr_factor(step, self.args.warmup_iters, self.args.lr_drop_at)
        for group, lr in zip(wrapper.optimizer.param_groups, self.base):
            group["lr"] = lr * factor
        return factor

    def graphed_steps(self, batches: list) -> list:
        """The graphed model's steps on ``batches`` ((step, data) pairs), one
        right behind the other (nothing waits on the device between them,
        as in a run logging once a burst), each step's starting state, its
        generator's state and whether it captured kept: (step, data, state,
        generator, captured, factor), the state after the last appended."""
        from msda_mm.models.dino.graphed_detector import StepLogs
        from msda_mm.parity.training import training_state

        kept = []
        for step, data in batches:
            if step in self.args.eval_at:
                validate(self.graphed, self.runner, self.cfg, self.args.eval_batches)
            factor = self.set_lr(self.ours, step)
            state = training_state(self.graphed, self.ours.optimizer)
            generator, keys = self.get_generator(), len(self.graphed.captured_keys)
            logged = self.graphed.train_step(copy.deepcopy(data), self.ours)
            kept.append([step, data, state, generator,
                         len(self.graphed.captured_keys) > keys, factor])
        kept.append(training_state(self.graphed, self.ours.optimizer))
        self.graphed_logs = StepLogs.recorded(logged, len(batches))
        return kept

    def compared(self, kept: list) -> list:
        """The twin's steps from each kept state, twice, against the graphed
        model's: the rows they add."""
        from msda_mm.parity.training import (
            flat_tensors,
            load_training_state,
            relative_along,
            relative_distances,
        )

        *steps, after = kept
        rows = []
        for i, (step, data, state, generator, captured, factor) in enumerate(steps):
            end = steps[i + 1][2] if i + 1 < len(steps) else after
            logs = {"graphed": self.graphed_logs[i]}
            # The parameters' and the float buffers' (BN's statistics) changes by side.
            starts = [flat_tensors(self.graphed, state, names) for names in self.flat_names]
            updates, moved = ({"graphed": flat_tensors(self.graphed, end, names) - start}
                              for names, start in zip(self.flat_names, starts))
            self.set_lr(self.theirs, step)
            for side in ("eager", "eager_again"):
                load_training_state(self.twin, self.theirs.optimizer, state)
                self.set_generator(generator)
                logs[side] = self.twin.train_step(copy.deepcopy(data), self.theirs)
                updates[side], moved[side] = (flat_tensors(self.twin, None, names) - start
                                              for names, start in zip(self.flat_names, starts))
            self.graphed_err = self.graphed_err + per_parameter(
                updates["graphed"], updates["eager"], self.sizes)
            self.floor_err = self.floor_err + per_parameter(
                updates["eager_again"], updates["eager"], self.sizes)
            rows.append(dict(
                step=step, lr_factor=factor, evaluated=step in self.args.eval_at,
                captured_keys=len(self.graphed.captured_keys), captured_now=captured,
                **dict(zip(DISTANCES, relative_distances(
                    [(changes["graphed"], changes["eager"]) for changes in (updates, moved)] +
                    [(changes["eager_again"], changes["eager"]) for changes in (updates, moved)]))),
                **dict(zip(ALONG, relative_along([(updates["graphed"], updates["eager"]),
                                                  (updates["eager_again"], updates["eager"])]))),
                **{side: {k: float(v) for k, v in log.items()} for side, log in logs.items()}))
        self.rows += rows
        return rows


if __name__ == "__main__":
    sys.exit(main())
