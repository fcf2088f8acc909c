"""Train a detector: ``python tools/train.py CONFIG [--work-dir DIR]
[--cfg-options k=v ...] [--amp] [--auto-scale-lr] [--resume [CKPT]]
[--start-if-nothing-to-resume] [--launcher {none,pytorch,slurm,mpi}]`` --
mmdet's tools/train.py command line, run by mmengine's Runner, with
checkpoints saved and resumed through msda_mm's VerifiedCheckpointHook.
Multi-GPU: tools/dist_train.sh."""
from __future__ import annotations

import argparse

from common import add_common_args, build_runner, load_config, uses_amp

# AmpOptimWrapper's (and SelectiveAmpOptimWrapper's) own arguments, which
# plain OptimWrapper rejects.
_AMP_ONLY_ARGS = ("dtype", "loss_scale", "use_fsdp", "fp32_modules")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a detector")
    parser.add_argument("config", help="train config file")
    add_common_args(parser)
    parser.add_argument("--amp", action="store_true",
                        help="mixed precision (fp16 autocast, dynamic loss scale); a config "
                             "that autocasts already is left as it is")
    parser.add_argument("--auto-scale-lr", action="store_true",
                        help="scale the LR by the actual over the config's "
                             "auto_scale_lr.base_batch_size")
    parser.add_argument("--resume", nargs="?", const="auto",
                        help="resume from CKPT, or without CKPT from the newest whole "
                             "checkpoint in the work dir (stops if there is none)")
    parser.add_argument("--start-if-nothing-to-resume", action="store_true",
                        help="with --resume: where the work dir has no checkpoint, start "
                             "from scratch (with a warning) instead of stopping")
    args = parser.parse_args(argv)
    if args.start_if_nothing_to_resume and args.resume != "auto":
        parser.error("--start-if-nothing-to-resume goes with --resume (without CKPT)")
    return args


def apply_train_args(cfg, args: argparse.Namespace) -> None:
    # As mmdet's tool: a config that autocasts already (AmpOptimWrapper or a
    # subclass, e.g. SelectiveAmpOptimWrapper) is left as it is.
    if args.amp and not uses_amp(cfg.optim_wrapper):
        cfg.optim_wrapper.type = "AmpOptimWrapper"
        cfg.optim_wrapper.loss_scale = "dynamic"
    if args.auto_scale_lr:
        if "base_batch_size" not in cfg.get("auto_scale_lr", {}):
            raise SystemExit("--auto-scale-lr needs auto_scale_lr.base_batch_size in the config")
        cfg.auto_scale_lr.enable = True
    if args.resume == "auto":
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        cfg.resume, cfg.load_from = True, args.resume
    if args.start_if_nothing_to_resume:
        checkpoint = cfg.default_hooks.get("checkpoint") or {}
        if checkpoint.get("type") != "VerifiedCheckpointHook":
            raise SystemExit("--start-if-nothing-to-resume needs VerifiedCheckpointHook as "
                             "default_hooks.checkpoint, got " + repr(checkpoint.get("type")))
        checkpoint["start_if_nothing_to_resume"] = True


def check_precision(cfg, config_path: str) -> None:
    """Stop with a clear message where AMP cannot run, rather than at
    AmpOptimWrapper's bare assertion deep inside the Runner; and let
    ``--cfg-options optim_wrapper.type=OptimWrapper`` turn an AMP config
    into fp32 by dropping the AMP-only arguments it leaves behind."""
    import torch

    wrapper = cfg.get("optim_wrapper", {})
    if wrapper.get("type") == "OptimWrapper":
        for key in _AMP_ONLY_ARGS:
            wrapper.pop(key, None)
    elif uses_amp(wrapper) and not torch.cuda.is_available():
        dtype = wrapper.get("dtype") or "float16"
        raise SystemExit(
            f"{config_path} trains with {getattr(wrapper['type'], '__name__', wrapper['type'])} "
            f"({dtype} mixed precision), which needs "
            f"a CUDA GPU, and none is available.\nWithout a GPU, either train the CPU demo:\n"
            f"  python tools/train.py configs/synthetic/dino_tiny_cpu.py\n"
            f"or run this config in fp32 (slow on CPU):\n"
            f"  python tools/train.py {config_path} --cfg-options optim_wrapper.type=OptimWrapper")


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = load_config(args)
    apply_train_args(cfg, args)
    check_precision(cfg, args.config)
    build_runner(cfg).train()


if __name__ == "__main__":
    main()
