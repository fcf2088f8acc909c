"""Command-line pieces that tools/parity.py and tools/profile_step.py share."""
from __future__ import annotations

import argparse
import json
import math
import os.path as osp
from pathlib import Path

import torch
from mmengine.config import DictAction

from ..bench.report import environment


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return value


def add_config_args(parser: argparse.ArgumentParser, default_out: str) -> None:
    """CONFIG, --cfg-options (as tools/train.py takes them) and --out;
    ``default_out`` is a folder name under ./work_dirs/<config name>/."""
    parser.add_argument("config", help="config file")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, metavar="KEY=VALUE",
                        help="override config settings as tools/train.py does")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help=f"folder for the reports and the Runner's logs "
                             f"(default: ./work_dirs/<config name>/{default_out})")
    parser.set_defaults(default_out=default_out)


def config_namespace(args: argparse.Namespace) -> argparse.Namespace:
    """What tools/common.load_config reads, from add_config_args' arguments
    (single process; --out is the Runner's work_dir).  Fills in args.out."""
    if not osp.isfile(args.config):
        raise SystemExit(f"config file not found: {args.config}")
    if args.out is None:
        name = osp.splitext(osp.basename(args.config))[0]
        args.out = Path("work_dirs") / name / args.default_out
    return argparse.Namespace(config=args.config, cfg_options=args.cfg_options,
                              work_dir=str(args.out), launcher="none", local_rank=0)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def write_json(path: Path, report: dict, device: torch.device) -> None:
    """``report`` plus the environment (device, torch, triton, date), as
    strict JSON: non-finite floats (a diverged loss) become strings."""
    def strict(value):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, dict):
            return {k: strict(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [strict(v) for v in value]
        return value

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(strict(dict(report, environment=environment(device))),
                               indent=1) + "\n")
