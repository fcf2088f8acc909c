"""The host time of one eager MSDA forward + backward on a GPU, msda_mm beside
the peers' wrappers, measured repeatedly: in one process, calls alternating
between the implementations, in blocks.

    python research/host_paired.py [--presets decoder,dino_decoder] [--dtypes fp32,fp16,bf16]
        [--impl msda_mm,msda_triton] [--blocks 5] [--reps 200] [--warmup 20] [--out DIR]

Each call is what the benchmark's ``host_fwdbwd_us`` times (bench/op/cell.py):
from a synchronised, idle device (L2 flushed) until ``torch.autograd.grad``
of the output returns, on uniform seed-0 inputs of the preset.  A cell runs
``--blocks`` blocks of ``--reps`` rounds, one call of each implementation a
round, the order reversed every other round.  Reported per cell and
implementation: the median of all calls and of each block; against the first
implementation, the paired ratio (median over rounds of its time over the
other's in the same round, so the host's drift cancels) and the number of
blocks whose median is lower for the first implementation.

The first implementation is ``msda_mm`` by default; peers that are not
installed, or cannot take the dtype (mmcv and bf16), are reported as n/a.  On
CPU (tests) the wall time of each call is timed instead.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import sys
import time
from pathlib import Path

# Runs as `python research/host_paired.py` from a checkout, installed or not.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.op.cli import names  # noqa: E402
from bench.op.impls import IMPLS, routed, unavailable  # noqa: E402
from bench.op.presets import PRESETS  # noqa: E402
from bench.op.report import write_results  # noqa: E402
from bench.op.run import DTYPES, preset_inputs  # noqa: E402
from bench.op.timing import flushed_and_idle  # noqa: E402
from research.host import alternating_times_us, forward_backward, paired_ratio  # noqa: E402


def cell_times(calls: dict, device: torch.device, blocks: int, reps: int,
               warmup: int) -> list[dict]:
    """[{name: us of each call}] for each of ``blocks`` blocks of ``reps``
    alternating rounds of ``calls``, each call on an idle device, after
    ``warmup`` untimed calls of each (compilation, autotuning, allocator)."""
    return [alternating_times_us(calls, reps, warmup=warmup if block == 0 else 0,
                                 clock=time.perf_counter,
                                 before=functools.partial(flushed_and_idle, device))
            for block in range(blocks)]


def summarize(block_times: list[dict], first: str) -> dict:
    """Per implementation: the median of all calls, each block's median and,
    against ``first``, the paired ratio and the blocks where ``first`` is lower."""
    summary = {}
    every = {name: [t for block in block_times for t in block[name]] for name in block_times[0]}
    for name, times in every.items():
        medians = [statistics.median(block[name]) for block in block_times]
        row = dict(median_us=statistics.median(times), block_medians_us=medians)
        if name != first:
            row["first_over_this"] = paired_ratio(every[first], times)
            row["blocks_first_lower"] = sum(
                statistics.median(block[first]) < m for block, m in zip(block_times, medians))
        summary[name] = row
    return summary


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", type=names(PRESETS), default=("decoder", "dino_decoder"))
    parser.add_argument("--dtypes", type=names(DTYPES), default=tuple(DTYPES))
    parser.add_argument("--impl", type=names(IMPLS), default=("msda_mm", "msda_triton"),
                        help="the first is the one compared (default msda_mm,msda_triton)")
    parser.add_argument("--blocks", type=int, default=5, help="blocks a cell (default 5)")
    parser.add_argument("--reps", type=int, default=200,
                        help="rounds a block, one call of each implementation (default 200)")
    parser.add_argument("--warmup", type=int, default=20,
                        help="untimed calls of each before a cell's first block (default 20)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, help="write <out>/<gpu>-host-paired.json too, "
                        "rewritten after each cell")
    args = parser.parse_args(argv)
    if min(args.blocks, args.reps, args.warmup) < 1:
        parser.error("--blocks, --reps and --warmup must be >= 1")
    if len(args.impl) < 2:
        parser.error(f"--impl needs two implementations or more, got {','.join(args.impl)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    first = args.impl[0]
    cells = []
    for preset, dtype, inputs in preset_inputs(args.presets, args.dtypes, device):
        missing = {impl: why for impl in args.impl
                   if (why := unavailable(impl, device, inputs.value.dtype))}
        for impl, why in missing.items():
            print(f"n/a   {preset} {dtype} {impl}: {why}")
        impls = [impl for impl in args.impl if impl not in missing]
        if first not in impls or len(impls) < 2:
            continue
        with contextlib.ExitStack() as stack:
            for impl in impls:
                stack.enter_context(routed(impl))
            calls = {impl: forward_backward(impl, inputs) for impl in impls}
            summary = summarize(cell_times(calls, device, args.blocks, args.reps,
                                            args.warmup), first)
        cells.append(dict(preset=preset, dtype=dtype, blocks=args.blocks, reps=args.reps,
                          impls=summary))
        for impl, row in summary.items():
            versus = ("" if impl == first else
                      f"  {first}/this {row['first_over_this']:.3f}, {first} lower in "
                      f"{row['blocks_first_lower']}/{args.blocks} blocks")
            blocks = " ".join(f"{m:.0f}" for m in row["block_medians_us"])
            print(f"{preset:13s} {dtype:5s} {impl:12s} {row['median_us']:8.1f} us "
                  f"(blocks {blocks}){versus}")
        del calls
        if args.out:
            write_results(args.out, device, "host-paired", cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
