"""Training throughput of one config, and where a step's time goes.

    python tools/profile_step.py CONFIG [--batch-size N] [--iters N] [--warmup N]
        [--profile-iters N] [--back-to-back] [--amp {bf16,fp16,none}]
        [--image-size H W] [--out DIR] [--cfg-options k=v ...]

Builds the model, optimizer and train dataloader through the config's
Runner and calls ``model.train_step(data, optim_wrapper)`` in a loop:
--warmup steps, then --iters timed steps (ms/iter, images/s, peak GPU
memory; each synchronised, or with --back-to-back the whole run as a
training loop runs it, without a wait between steps), then
--profile-iters more under torch.profiler (device time, the MSDA kernels'
share of it, the top host costs, synchronisation points), then on CUDA
--sync-iters more under PyTorch's sync debug mode, which names the Python
frame of every wait on the device (the trace could not there:
bench/step/syncs.py).  Data loading is outside the timed and profiled
ranges.  With
--image-size the steps train on synthetic shapes of exactly H x W
(generated once under data/), whatever data the config names.  Writes
profile.json and profile.md to --out.
"""
from __future__ import annotations

import argparse

from common import add_config_args, positive_int

# --amp: the optimizer wrapper each choice sets.
AMP = {"bf16": dict(type="AmpOptimWrapper", dtype="bfloat16"),
       "fp16": dict(type="AmpOptimWrapper", dtype="float16", loss_scale="dynamic"),
       "none": dict(type="OptimWrapper")}

def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_config_args(parser, default_out="profile")
    parser.add_argument("--batch-size", type=positive_int, metavar="N",
                        help="images per step (default: the config's train batch size)")
    parser.add_argument("--iters", type=positive_int, default=20, metavar="N",
                        help="timed steps (default 20)")
    parser.add_argument("--warmup", type=int, default=5, metavar="N",
                        help="untimed steps first: autotuning, allocator, cuDNN (default 5)")
    # Tracing every Python call costs seconds a step (and memory to match):
    # a few steps give the per-step figures.
    parser.add_argument("--profile-iters", type=positive_int, default=5, metavar="N",
                        help="steps traced by torch.profiler after the timed ones (default 5)")
    parser.add_argument("--sync-iters", type=int, default=2, metavar="N",
                        help="CUDA: steps whose waits on the device are counted by Python "
                             "frame in sync debug mode after the profiled ones (default 2)")
    parser.add_argument("--back-to-back", action="store_true",
                        help="time the steps as a training loop runs them, without a wait "
                             "between them (default: each step synchronised)")
    parser.add_argument("--amp", choices=AMP, help="precision (default: the config's)")
    parser.add_argument("--image-size", type=positive_int, nargs=2, metavar=("H", "W"),
                        help="train on synthetic H x W images instead of the config's data")
    args = parser.parse_args(argv)
    for name in ("warmup", "sync_iters"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    args.amp_wrapper = AMP.get(args.amp)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    # Here, after the command line is read: torch, mmdet and msda_mm take seconds.
    from profile_step_measure import run

    run(args)


if __name__ == "__main__":
    main()
