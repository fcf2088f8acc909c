"""What tools/train.py and tools/test.py share: the mmdet-style command line
they both take, turning it into a config, and building the Runner.

Importing msda_mm.datasets (and with it msda_mm) makes the registrations
(TritonMSDeformAttn, SyntheticShapesDataset) and the mmcv-lite shims active
even for a config without ``custom_imports``.
"""
from __future__ import annotations

import argparse
import os
import os.path as osp

import torch
from mmengine.config import Config, DictAction
from mmengine.optim import AmpOptimWrapper
from mmengine.registry import RUNNERS
from mmengine.runner import CheckpointLoader, Runner

import msda_mm.datasets  # noqa: F401  (registrations and mmcv-lite shims)

# isort: split
from mmdet.registry import OPTIM_WRAPPERS


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """The arguments both tools take, spelled as mmdet's tools spell them."""
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


def load_config(args: argparse.Namespace) -> Config:
    """The config file with the command line applied.  work_dir: --work-dir,
    else the config's own, else ./work_dirs/<config name>."""
    os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get("work_dir") is None:
        cfg.work_dir = osp.join("./work_dirs", osp.splitext(osp.basename(args.config))[0])
    return cfg


def load_from_local_trusted(filename: str, map_location=None) -> dict:
    """mmengine's local checkpoint loader with ``weights_only=False``.

    torch >= 2.6 loads with ``weights_only=True`` by default, and mmengine
    0.10's checkpoints cannot be read that way: their message hub pickles
    HistoryBuffer objects with bound methods (``builtins.getattr``), which no
    allow-list can admit without giving up what weights_only protects.  The
    tools only load checkpoints their user names (--resume, load_from, the
    test checkpoint), i.e. trusted files, as before torch 2.6.
    """
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f"{filename} can not be found.")
    return torch.load(filename, map_location=map_location, weights_only=False)


def uses_amp(optim_wrapper_cfg) -> bool:
    """Whether an ``optim_wrapper`` config autocasts: mmengine's
    AmpOptimWrapper or a subclass of it (msda_mm's SelectiveAmpOptimWrapper)."""
    wrapper = optim_wrapper_cfg.get("type", "OptimWrapper")
    if isinstance(wrapper, str):
        wrapper = OPTIM_WRAPPERS.get(wrapper)
    return isinstance(wrapper, type) and issubclass(wrapper, AmpOptimWrapper)


def build_runner(cfg: Config) -> Runner:
    """mmengine's Runner, or the registered one a config names in runner_type,
    loading local checkpoints with ``load_from_local_trusted``."""
    CheckpointLoader.register_scheme(prefixes="", loader=load_from_local_trusted, force=True)
    if "runner_type" in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)
