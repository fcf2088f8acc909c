"""How many of a DINO run's matching queries start dead, per seed: the
top-k proposals that land on positions the encoder's proposal generator
marks invalid.

    python research/dead_queries.py CONFIG --seeds 1 2 3 [--steps 1]
        [--batch-size 2] [--out DIR] [--cfg-options k=v ...]

mmdet's DINO (``gen_encoder_output_proposals``) marks a position invalid
where its proposal box leaves (0.01, 0.99), the border cells of the finest
level (252 of the 5440 positions of a 512 x 512 image), or lies in padding.
Its box before the sigmoid is set to inf and its memory to zero before one
Linear and a LayerNorm, so every invalid position of an image has the same
class logits.  Where that constant outranks the valid positions' logits,
the top-k (``num_queries``) takes invalid positions: those queries' box is
(1, 1, 1, 1) at every decoder layer, and the saturated sigmoid leaves their
regression no gradient.  With fewer queries than invalid positions a run
can start with nearly every matching query dead; its box losses then stay
flat until the classifier ranks the invalid positions below the valid ones.

Per seed the run is built as tools/train.py builds it, the model
initialised as the run initialises it, and its first --steps training
steps run (on CPU eagerly and in fp32, the config's compiled layers left
uncompiled).  Per step, the fraction of the matching queries (the
``num_queries`` that follow the denoising queries) whose reference box is
1 in all four coordinates.  On CPU the count estimates a GPU run's: the
invalid positions' logit comes from weights drawn when the model is built
(by the CPU's generator, whatever the device), the valid positions' also
from weights ``init_weights`` draws on the run's device.  Writes
DIR/dead_queries.json.
"""
from __future__ import annotations

import argparse
import copy
import sys
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import common  # noqa: E402
from train import check_precision  # noqa: E402


class StepsDone(Exception):
    """Raised by the stopping hook once the steps asked for have run."""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_config_args(parser, default_out="dead_queries")
    parser.add_argument("--seeds", type=int, nargs="+", required=True, metavar="S",
                        help="randomness.seed of each run")
    parser.add_argument("--steps", type=common.positive_int, default=1, metavar="N",
                        help="training steps per seed (default 1)")
    parser.add_argument("--batch-size", type=common.positive_int, default=2, metavar="N",
                        help="images a step (default 2; the initial weights do not depend on it)")
    return parser.parse_args(argv)


def dead_fraction(reference_points: torch.Tensor, num_queries: int) -> float:
    """The fraction of the last ``num_queries`` queries of
    ``reference_points`` (B, denoising + matching queries, 4) whose box is 1
    in all four coordinates: sigmoid(inf), an invalid proposal."""
    if reference_points.dim() != 3 or reference_points.shape[-1] != 4:
        raise ValueError(f"reference_points must be (B, queries, 4), got "
                         f"{tuple(reference_points.shape)}")
    if not 0 < num_queries <= reference_points.shape[1]:
        raise ValueError(f"num_queries must be in 1..{reference_points.shape[1]}, "
                         f"got {num_queries}")
    boxes = reference_points[:, -num_queries:].detach().float()
    return (boxes == 1).all(-1).float().mean().item()


def seed_config(cfg, seed: int, batch_size: int, out: Path, on_cpu: bool):
    """``cfg`` for one seed's run: its own work_dir, no checkpoints, the
    loader in this process; on CPU fp32 (tools/train.py's check_precision
    drops the AMP-only arguments) and without compiled layers."""
    cfg = copy.deepcopy(cfg)
    cfg.randomness = dict(cfg.get("randomness", {}), seed=seed)
    cfg.work_dir = str(out / f"seed{seed}")
    cfg.train_dataloader.batch_size = batch_size
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.default_hooks.checkpoint = None
    if on_cpu:
        cfg.optim_wrapper.type = "OptimWrapper"
        check_precision(cfg, cfg.filename)
        cfg.custom_hooks = [hook for hook in cfg.get("custom_hooks", [])
                            if hook.get("type") != "CompileSubmodulesHook"]
    return cfg


def watch(model, fractions: list) -> None:
    """Append to ``fractions`` the dead fraction of every training forward
    of ``model`` (a DINO): its own ``pre_decoder`` wrapped on the instance,
    the class untouched."""
    pre_decoder = model.pre_decoder

    def recorded(self, *args, **kwargs):
        decoder_inputs, head_inputs = pre_decoder(*args, **kwargs)
        if self.training:
            fractions.append(dead_fraction(decoder_inputs["reference_points"],
                                           self.num_queries))
        return decoder_inputs, head_inputs

    model.pre_decoder = types.MethodType(recorded, model)


def first_steps(cfg, steps: int) -> list:
    """The dead fraction of each of the run's first ``steps`` training
    steps, the run built and trained as tools/train.py does."""
    from mmengine.hooks import Hook

    runner = common.build_runner(cfg)
    fractions = []
    watch(runner.model, fractions)

    class Stop(Hook):
        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            if len(fractions) >= steps:
                raise StepsDone

    runner.register_hook(Stop(), priority="LOWEST")
    try:
        runner.train()
    except StepsDone:
        pass
    return fractions


def main(argv=None) -> dict:
    from msda_mm.parity.report import write_json

    args = parse_args(argv)
    cfg = common.load_config(common.config_namespace(args))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    runs = []
    for seed in args.seeds:
        fractions = first_steps(seed_config(cfg, seed, args.batch_size, args.out,
                                            device.type == "cpu"), args.steps)
        runs.append(dict(seed=seed, dead_fraction=fractions))
        print(f"seed {seed}: dead matching queries "
              + ", ".join(f"{f:.3f}" for f in fractions), flush=True)
    words = sys.argv[1:] if argv is None else argv
    report = dict(command="python research/dead_queries.py " + " ".join(words),
                  config=args.config, steps=args.steps, batch_size=args.batch_size, runs=runs)
    write_json(args.out / "dead_queries.json", report, device)
    return report


if __name__ == "__main__":
    main()
