"""The GPU linear assignment beside scipy on DINO-like matching problems.

    python -m bench.matching.linear_assignment [--problems 56] [--queries 900]
        [--gts 20 60 100] [--dtype fp32] [--budget-ms 500]

For each GT cap G: P problems of N queries (8 images x 7 matched outputs by
default), checked against scipy (same total cost on every problem), then
timed: the kernel as CUDA-graph replays (median over many, with a cold and
a warm L2), and on the host scipy's linear_sum_assignment over the P
problems alone and with the one device-to-host copy of the packed costs
before it (what msda_mm/models/dino/matching.py pays per matched output).
Prints the device, the versions and a table.  Needs a CUDA device.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time

import numpy as np
import scipy
import torch
from scipy.optimize import linear_sum_assignment

from bench.matching.costs import dino_like_costs
from bench.op.timing import graph_times_us
from msda_mm.ops.linear_assignment import linear_assignment, linear_assignment_reference
from msda_mm.parity.report import environment

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Host timings: the median of this many runs of the whole batch.
HOST_REPS = 5


def max_total_gap(cost: torch.Tensor, num_cols: torch.Tensor, out: torch.Tensor) -> float:
    """The largest |total - scipy's total| over the problems."""
    costs = cost.cpu().double().numpy()
    reference = linear_assignment_reference(cost, num_cols).cpu().numpy()
    got = out.cpu().numpy()
    gaps = [abs(costs[p, got[p, :k], np.arange(k)].sum()
                - costs[p, reference[p, :k], np.arange(k)].sum())
            for p, k in enumerate(num_cols.cpu().tolist())]
    return max(gaps, default=0.0)


def scipy_ms(cost: torch.Tensor, num_cols: torch.Tensor, copy: bool) -> float:
    """Median ms of scipy over the P problems on the host, after the
    device-to-host copy of their real blocks, packed, if ``copy``."""
    counts = num_cols.cpu().tolist()
    packed = torch.cat([cost[p, :, :k].flatten() for p, k in enumerate(counts)]).float()
    host = packed.cpu().numpy()
    sizes = [cost.shape[1] * k for k in counts]

    def run() -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        flat = packed.cpu().numpy() if copy else host
        for block, k in zip(np.split(flat, np.cumsum(sizes)[:-1]), counts):
            linear_sum_assignment(block.reshape(-1, k))
        return (time.perf_counter() - start) * 1e3

    return statistics.median(run() for _ in range(HOST_REPS))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problems", type=int, default=56, help="P: images x matched outputs")
    p.add_argument("--queries", type=int, default=900, help="N: rows of each problem")
    p.add_argument("--gts", type=int, nargs="+", default=[20, 60, 100], help="G caps")
    p.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    p.add_argument("--budget-ms", type=float, default=500.0, help="per graph timing")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA device")
    device = torch.device("cuda")
    env = environment(device)
    print(f"{env['device']} (sm {env['capability']}), torch {env['torch']}, "
          f"triton {env['triton']}, scipy {scipy.__version__}, python {env['python']}")
    print(f"P={args.problems} problems of N={args.queries} rows, {args.dtype} costs")

    header = ("G", "max |total - scipy|", "kernel cold us", "kernel warm us", "scipy ms",
              "copy + scipy ms", "speed-up")
    rows = []
    for G in args.gts:
        cost, num_cols = dino_like_costs(args.problems, args.queries, G, seed=G, device=device,
                                         dtype=DTYPES[args.dtype])
        gap = max_total_gap(cost, num_cols, linear_assignment(cost, num_cols))
        cold, warm = graph_times_us(functools.partial(linear_assignment, cost, num_cols), device,
                                    args.budget_ms)
        host, copied = scipy_ms(cost, num_cols, copy=False), scipy_ms(cost, num_cols, copy=True)
        rows.append((str(G), f"{gap:.3g}", f"{cold:.1f}", f"{warm:.1f}", f"{host:.2f}",
                     f"{copied:.2f}", f"{copied * 1e3 / cold:.1f}x"))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print(" | ".join(text.rjust(w) for text, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
