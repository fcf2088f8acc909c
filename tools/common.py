"""What the config tools (train, test, parity, profile_step) share: their
mmdet-style command line, turning it into a config, and building the Runner.

Only the command line is read at import: torch, mmdet and msda_mm are
imported when a Runner is built (``--help`` and a bad command line answer
at once).  Importing msda_mm.datasets (and with it msda_mm) makes the
registrations (TritonMSDeformAttn, SyntheticShapesDataset,
VerifiedCheckpointHook), the mmcv-lite shims and the checkpoint allow-list
active even for a config without ``custom_imports``.

bench/ (the lab beside the package: profiling, plots) is never installed:
importing this module puts the checkout's root first on sys.path, as
benchmark.py does, so that the tools import bench/ and msda_mm from the
checkout they belong to.
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import sys
from pathlib import Path

from mmengine.config import Config, DictAction

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return value


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """The arguments train.py and test.py take, spelled as mmdet's tools spell them."""
    parser.add_argument("--work-dir", help="where logs, checkpoints and metrics go "
                        "(default: ./work_dirs/<config name>)")
    parser.add_argument(
        "--cfg-options", nargs="+", action=DictAction,
        help="override config settings, key=value (nested keys with dots, lists as "
             'key="[a,b]" or key=a,b, no spaces), e.g. train_cfg.max_iters=100')
    parser.add_argument("--launcher", choices=["none", "pytorch", "slurm", "mpi"],
                        default="none", help="job launcher (pytorch: torchrun, see "
                        "tools/dist_train.sh)")
    # torch.distributed.launch passes --local-rank (torch >= 2.0) or
    # --local_rank (older); torchrun sets LOCAL_RANK itself.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=0,
                        help=argparse.SUPPRESS)


def add_config_args(parser: argparse.ArgumentParser, default_out: str) -> None:
    """CONFIG, --cfg-options (as train.py takes them) and --out, for parity.py
    and profile_step.py; ``default_out`` is a folder under ./work_dirs/<config name>/."""
    parser.add_argument("config", help="config file")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, metavar="KEY=VALUE",
                        help="override config settings as tools/train.py does")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help=f"folder for the reports and the Runner's logs "
                             f"(default: ./work_dirs/<config name>/{default_out})")
    parser.set_defaults(default_out=default_out)


def config_namespace(args: argparse.Namespace) -> argparse.Namespace:
    """What load_config reads, from add_config_args' arguments (single
    process; --out is the Runner's work_dir).  Fills in args.out."""
    if not osp.isfile(args.config):
        raise SystemExit(f"config file not found: {args.config}")
    if args.out is None:
        name = osp.splitext(osp.basename(args.config))[0]
        args.out = Path("work_dirs") / name / args.default_out
    return argparse.Namespace(config=args.config, cfg_options=args.cfg_options,
                              work_dir=str(args.out), launcher="none", local_rank=0)


def verify_checkpoints(cfg: Config) -> None:
    """Save and load checkpoints through msda_mm's VerifiedCheckpointHook
    where the config keeps mmengine's plain CheckpointHook (or the Runner's
    default one)."""
    if cfg.get("default_hooks") is None:
        cfg.default_hooks = {}
    hooks = cfg.default_hooks
    checkpoint = hooks.get("checkpoint", dict(type="CheckpointHook", interval=1))
    if checkpoint is not None and checkpoint.get("type") == "CheckpointHook":
        hooks["checkpoint"] = dict(checkpoint, type="VerifiedCheckpointHook")


def load_config(args: argparse.Namespace) -> Config:
    """The config file with the command line applied and verified
    checkpoints.  work_dir: --work-dir, else the config's own, else
    ./work_dirs/<config name>."""
    os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get("work_dir") is None:
        cfg.work_dir = osp.join("./work_dirs", osp.splitext(osp.basename(args.config))[0])
    verify_checkpoints(cfg)
    return cfg


def uses_amp(optim_wrapper_cfg) -> bool:
    """Whether an ``optim_wrapper`` config autocasts: mmengine's
    AmpOptimWrapper or a subclass of it (msda_mm's SelectiveAmpOptimWrapper)."""
    from mmdet.registry import OPTIM_WRAPPERS
    from mmengine.optim import AmpOptimWrapper

    import msda_mm  # noqa: F401  (registers SelectiveAmpOptimWrapper; mmcv-lite shims first)

    wrapper = optim_wrapper_cfg.get("type", "OptimWrapper")
    if isinstance(wrapper, str):
        wrapper = OPTIM_WRAPPERS.get(wrapper)
    return isinstance(wrapper, type) and issubclass(wrapper, AmpOptimWrapper)


def build_runner(cfg: Config):
    """mmengine's Runner, or the registered one a config names in runner_type."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    import msda_mm.datasets  # noqa: F401  (registrations, mmcv-lite shims, allow-list)

    if "runner_type" in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)
