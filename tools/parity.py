"""Parity of msda_mm's TritonMSDeformAttn with mmcv's MultiScaleDeformableAttention
inside a whole detector.

    python tools/parity.py eval CONFIG CHECKPOINT [--max-batches N] [--tolerance-ap 0.1]
        [--tolerance-layer X] [--mmcv {cuda,pytorch}] [--out DIR] [--cfg-options k=v ...]
    python tools/parity.py train CONFIG [--iters N] [--seed S] [--mmcv {cuda,pytorch}] [--out DIR]
        [--cfg-options k=v ...]
    python tools/parity.py grads CONFIG [--checkpoint CKPT] [--seed S] [--out DIR]
        [--cfg-options k=v ...]
    python tools/parity.py kernels CONFIG [--checkpoint CKPT] [--seed S] [--max-calls N]
        [--mmcv {cuda,pytorch}] [--out DIR] [--cfg-options k=v ...]

Each run switches every MSDA module of one model between the two ops (same
weights: see msda_mm/parity/attention.py for what the mmcv side runs).  On CUDA
the mmcv side runs mmcv's own CUDA kernels where they are here (compiled
mmcv, or on mmcv-lite the build of tools/build_mmcv_msda.py), else mmcv's
PyTorch function; --mmcv chooses, and every report says what each side ran.

eval: tests the checkpoint with each op (both COCO AP tables), compares the
outputs of every attention layer on the first test batch, and exits 0 if
every AP metric agrees within --tolerance-ap AP points (and every layer
within --tolerance-layer, if given), 1 if not.  Writes parity_eval.json.

train: --iters training steps with each op from the same weights, seed
and data order; compares the total loss per iteration (relative
difference) and writes parity_train.json and parity_train.png.

grads: not mmcv's side but msda_mm's own precision: one training batch,
backward four times from the same weights and random state, with the op as
configured (twice: the run-to-run floor of its atomics), with
``fp32_grad_accum=True`` and with ``fp32_compute=True`` on every
TritonMSDeformAttn (msda_mm/parity/gradients.py); the relative difference of
each parameter's gradient between them.  Writes parity_grads.json.

kernels: also msda_mm's own precision, on the op's real inputs: one training
batch's forward (the config's AMP, so a bf16 config on CUDA), with each of
the first --max-calls op calls on a bf16 value also run, forward and
backward, on the bf16 and the fp32 kernels and checked against each other
(msda_mm/parity/kernel_check.py), and with mmcv's CUDA kernels the fp32
kernels' relative difference from them reported beside (not judged); exits
0 if every call is within, 3 if one is not, 4 if no call had a bf16 value
(1 and 2 stay Python's and argparse's: a crash, a bad command line).
Writes parity_kernels.json.
"""
from __future__ import annotations

import argparse
import math
import sys

from common import add_config_args, positive_int

# msda_mm.parity.attention.MMCV_KERNELS, spelled here: that module imports torch
# and mmcv (seconds) and --help answers before them; mmcv_side checks the choice.
MMCV_KERNELS = ("cuda", "pytorch")


def non_negative_float(text: str) -> float:
    """argparse type: a finite float >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= 0")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    ev = commands.add_parser("eval", help="test one checkpoint with each op and compare")
    add_config_args(ev, default_out="parity_eval")
    ev.add_argument("checkpoint", help="checkpoint file (loads into both ops)")
    ev.add_argument("--max-batches", type=positive_int, metavar="N",
                    help="test on the first N batches only (AP over their images)")
    ev.add_argument("--tolerance-ap", type=non_negative_float, default=0.1, metavar="AP",
                    help="largest accepted |AP difference| in AP points (default 0.1)")
    ev.add_argument("--tolerance-layer", type=non_negative_float, metavar="X",
                    help="also fail if an attention layer's outputs differ by more than this "
                         "(max abs); default: reported only")
    _add_mmcv_arg(ev)

    tr = commands.add_parser("train", help="train a few steps with each op and compare")
    add_config_args(tr, default_out="parity_train")
    tr.add_argument("--iters", type=positive_int, default=20, metavar="N",
                    help="training steps per op (default 20)")
    tr.add_argument("--seed", type=int, default=0, metavar="S",
                    help="seed of weights, data order and random draws, the same for both ops "
                         "(default 0)")
    _add_mmcv_arg(tr)

    gr = commands.add_parser("grads", help="one batch's gradients with the op as configured, "
                                           "with fp32_grad_accum and with fp32_compute")
    add_config_args(gr, default_out="parity_grads")
    _add_batch_args(gr)

    ke = commands.add_parser("kernels", help="one batch's op calls on bf16 values checked "
                                             "against the fp32 kernels")
    add_config_args(ke, default_out="parity_kernels")
    _add_batch_args(ke)
    ke.add_argument("--max-calls", type=positive_int, default=32, metavar="N",
                    help="op calls to check (default 32; a DINO step makes 12)")
    _add_mmcv_arg(ke)
    return parser.parse_args(argv)


def _add_mmcv_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mmcv", choices=MMCV_KERNELS,
                        help="what the mmcv side runs on CUDA: cuda (mmcv's own kernels: "
                             "compiled mmcv's, or on mmcv-lite the build of "
                             "tools/build_mmcv_msda.py) or pytorch (mmcv's "
                             "multi_scale_deformable_attn_pytorch); default: cuda where those "
                             "kernels are here, else pytorch")


def _add_batch_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", help="weights to start from (default: the model's own "
                                             "initialisation, or the config's load_from)")
    parser.add_argument("--seed", type=int, default=0, metavar="S",
                        help="seed of the weights' initialisation, the batch and the random "
                             "draws (default 0)")


def main(argv=None) -> int:
    args = parse_args(argv)
    # Here, after the command line is read: torch, mmdet and msda_mm take seconds.
    from parity_commands import COMMANDS

    return COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
