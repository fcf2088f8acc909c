"""Whether one recipe's final weights lean one way against another's, seed
by seed: per floating tensor of each pair's checkpoints, which norm is the
larger.

    python research/weight_norms.py --pair A B [--pair A B ...] [--out FILE]

A and B are a run of the first recipe and one of the second from the same
seed: each an mmengine checkpoint (its ``state_dict``) or a JSON of
{tensor name: L2 norm} as ``--save-norms DIR`` writes for every checkpoint
read (DIR/<its folder>_<its name>.json). Over the pairs: the (tensor,
pair) cases where A's norm is the larger, the tensors whose sign keeps in
every pair (chance: a 2 / 2**pairs share), the median absolute log ratio,
and per pair the ratio of the whole state's norms. Rounding that sends two
runs apart scatters the signs; a recipe that grows or shrinks some weights
keeps them.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

Norms = Dict[str, float]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", nargs=2, action="append", required=True, type=Path,
                        metavar=("A", "B"), help="a run of each recipe, same seed (repeat)")
    parser.add_argument("--save-norms", type=Path, metavar="DIR",
                        help="write each checkpoint's norms to DIR/<its folder>_<its name>.json")
    parser.add_argument("--out", type=Path, metavar="FILE", help="the summary as JSON")
    return parser.parse_args(argv)


def tensor_norms(state_dict: dict) -> Norms:
    """Each floating tensor's L2 norm (in float32)."""
    return {name: value.float().norm().item()
            for name, value in state_dict.items()
            if isinstance(value, torch.Tensor) and value.is_floating_point()}


def read_norms(path: Path, save_dir: Optional[Path] = None) -> Norms:
    """A checkpoint's tensor norms, or a norms JSON's; ValueError naming
    ``path`` where neither holds any."""
    if path.suffix == ".json":
        norms = json.loads(path.read_text())
    else:
        from msda_mm.engine.checkpoint_allowlist import allow_mmengine_checkpoints
        allow_mmengine_checkpoints()
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        norms = tensor_norms(checkpoint.get("state_dict", checkpoint)
                             if isinstance(checkpoint, dict) else {})
        if save_dir is not None and norms:
            save_dir.mkdir(parents=True, exist_ok=True)
            saved = save_dir / f"{path.parent.name}_{path.stem}.json"
            saved.write_text(json.dumps(norms, indent=0) + "\n")
    if not isinstance(norms, dict) or not norms:
        raise ValueError(f"{path}: no floating tensors (an mmengine checkpoint or a norms "
                         f"JSON of {{tensor name: norm}} expected)")
    return norms


def compare(pairs: Sequence[Tuple[Norms, Norms]]) -> dict:
    """The lean of A's norms against B's over ``pairs`` (module docstring);
    the tensors compared are those with a positive norm in every run."""
    if not pairs:
        raise ValueError("compare needs at least one pair")
    names = [name for name in pairs[0][0]
             if all(a.get(name, 0.0) > 0 and b.get(name, 0.0) > 0 for a, b in pairs)]
    if not names:
        raise ValueError("the runs share no tensor of positive norm")
    logs: List[List[float]] = [[math.log(a[name] / b[name]) for a, b in pairs] for name in names]
    one_sign = [name for name, row in zip(names, logs)
                if all(x > 0 for x in row) or all(x < 0 for x in row)]
    cases = [x for row in logs for x in row]
    return dict(
        pairs=len(pairs), tensors=len(names),
        a_larger=sum(x > 0 for x in cases), cases=len(cases),
        one_sign=len(one_sign), one_sign_by_chance=len(names) * 2 / 2 ** len(pairs),
        median_abs_log_ratio=statistics.median(abs(x) for x in cases),
        model_norm_ratios=[math.sqrt(sum(a[n] ** 2 for n in names)
                                     / sum(b[n] ** 2 for n in names)) for a, b in pairs],
        one_sign_tensors=one_sign)


def main(argv=None) -> dict:
    args = parse_args(argv)
    pairs = [(read_norms(a, args.save_norms), read_norms(b, args.save_norms))
             for a, b in args.pair]
    summary = dict(compare(pairs), runs=[[str(a), str(b)] for a, b in args.pair])
    print(f"{summary['pairs']} pairs, {summary['tensors']} tensors: A's norm larger in "
          f"{summary['a_larger']} of {summary['cases']} cases; {summary['one_sign']} tensors "
          f"keep one sign (chance: {summary['one_sign_by_chance']:.1f}); median |log ratio| "
          f"{summary['median_abs_log_ratio']:.2g}; whole-state norm ratios "
          + " ".join(f"{r:.6f}" for r in summary["model_norm_ratios"]))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    main()
