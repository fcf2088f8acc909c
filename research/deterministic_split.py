"""The deterministic backward against the default one, kernel by kernel.

    python research/deterministic_split.py [--presets decoder,dino_decoder,encoder]
        [--dtypes bf16,fp32] [--distributions uniform,clustered]
        [--gather-tiles 2x1x16,1x1x32] [--sorts stable,counting] [--out benchmarks]

For each preset, dtype and location distribution, in one process: the
default backward (float atomics, the op's own accumulation), the
deterministic backward with the launcher's sort and tiles, with each of
--gather-tiles (grad_value_gather_kernel's BLOCK_SxWARPSxBLOCK_E) and with
each of --sorts (Tiles.deterministic_sort's answers, whatever the rows'
density), timed as the benchmark times (graph_us: CUDA-graph replay of one
backward after an L2 flush, median).  Each deterministic grad_value is
compared bit for bit with a second run of the same call (repeatable), the
gather tiles' with the launcher's (bitwise_equal); every grad_value's error
is ||x - ref|| / ||ref|| against the float64 reference.  kernels_us: the
kernels of the default backward and of each deterministic one but the gather
tiles (CUPTI, each kernel's median duration a call, the L2 flush's fill
included).  Writes <out>/<device-slug>-deterministic-split.json and prints a
table.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

# Runs as `python research/deterministic_split.py` from a checkout, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.op.cell import reference_fp64  # noqa: E402
from bench.op.cli import names, tiles  # noqa: E402
from bench.op.inputs import DISTRIBUTIONS, make_inputs  # noqa: E402
from bench.op.presets import PRESETS  # noqa: E402
from bench.op.report import write_results  # noqa: E402
from bench.op.run import DTYPES  # noqa: E402
from bench.op.timing import graph_times_us, kernel_spans  # noqa: E402
from msda_mm.ops import resolve_fp32_grad_accum  # noqa: E402
from msda_mm.ops.backward.launcher import launch_backward  # noqa: E402
from msda_mm.ops.tiles import SORTS, TUNED, Tiles  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", type=names(PRESETS),
                        default=("decoder", "dino_decoder", "encoder"))
    parser.add_argument("--dtypes", type=names(DTYPES), default=("bf16", "fp32"))
    parser.add_argument("--distributions", type=names(DISTRIBUTIONS),
                        default=DISTRIBUTIONS)
    parser.add_argument("--gather-tiles", type=tiles("BLOCK_SxWARPSxBLOCK_E", "2x1x16"),
                        default=[], help="gather tiles to time besides the launcher's")
    parser.add_argument("--sorts", type=names(SORTS), default=(),
                        help="deterministic sorts to time besides the launcher's choice")
    parser.add_argument("--budget-ms", type=float, default=300.0,
                        help="time spent repeating each timed call (default 300)")
    parser.add_argument("--kernel-reps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("benchmarks"))
    return parser.parse_args(argv)


def kernel_split_us(fn, device: torch.device, reps: int) -> dict[str, float]:
    """Each kernel's median duration (us) a call over ``reps`` calls of
    ``fn`` (timing.kernel_spans: CUPTI, cold L2), keyed by kernel name; the
    flush's own fill (at::native's fill kernel) included."""
    spans: dict[str, list[float]] = {}
    for _, duration, name in kernel_spans(fn, device, reps):
        spans.setdefault(name, []).append(duration / 1e3)
    return {name: round(statistics.median(d) * len(d) / reps, 1) for name, d in spans.items()}


def _backward(inputs, deterministic: bool, tile=None, sort=None):
    """A call of launch_backward on ``inputs`` (the op's own accumulation
    for the default backward; ``tile`` the gather's, ``sort`` the
    deterministic sort); returns grad_value."""
    accum = resolve_fp32_grad_accum(inputs.value, None)
    tiles = Tiles(gather=tile, sort=sort)

    def call():
        return launch_backward(
            inputs.grad_output, inputs.value, inputs.spatial_shapes,
            inputs.sampling_locations, inputs.attention_weights, accum, deterministic,
            tiles=tiles)[0]
    return call


def measure(preset, dtype, distribution, device, tiles, sorts, budget_ms,
            kernel_reps) -> dict:
    """One cell: the default and the deterministic backwards, timed and split."""
    inputs = make_inputs(PRESETS[preset], distribution).to(device, DTYPES[dtype])
    calls = {"default": _backward(inputs, False), "deterministic": _backward(inputs, True)}
    for tile in tiles:
        calls["gather " + "x".join(map(str, tile))] = _backward(inputs, True, tile)
    for sort in sorts:
        calls[f"{sort} sort"] = _backward(inputs, True, sort=sort)
    _, Q, _, L, K, _ = inputs.sampling_locations.shape
    row = dict(preset=preset, dtype=dtype, distribution=distribution,
               sort=TUNED.deterministic_sort(inputs.value, Q * L * K))
    reference = reference_fp64(inputs)[1]
    first = calls["deterministic"]()
    row["bitwise_equal"] = {name: bool(torch.equal(calls[name](), first))
                            for name in calls if name.startswith(("deterministic", "gather"))}
    del first
    row["repeatable"], row["grad_value_error"] = {}, {}
    for name, call in calls.items():
        got = call()
        if name != "default":
            row["repeatable"][name] = bool(torch.equal(call(), got))
        row["grad_value_error"][name] = float(
            (got.double() - reference).norm() / reference.norm())
    del reference, got
    row["graph_us"] = {name: round(graph_times_us(call, device, budget_ms)[0], 1)
                       for name, call in calls.items()}
    row["kernels_us"] = {name: kernel_split_us(call, device, kernel_reps)
                         for name, call in calls.items() if not name.startswith("gather")}
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("research/deterministic_split.py times CUDA kernels: it needs a GPU")
    device = torch.device("cuda")
    rows = []
    for preset in args.presets:
        for dtype in args.dtypes:
            for distribution in args.distributions:
                row = measure(preset, dtype, distribution, device, args.gather_tiles,
                              args.sorts, args.budget_ms, args.kernel_reps)
                rows.append(row)
                base = row["graph_us"]["default"]
                times = "  ".join(f"{k} {v} ({v / base:.2f}x)"
                                  for k, v in row["graph_us"].items() if k != "default")
                print(f"{preset:13s} {dtype:5s} {distribution:9s} ({row['sort']} sort) "
                      f"default {base}  {times}  "
                      f"bitwise {all(row['bitwise_equal'].values())} "
                      f"repeatable {all(row['repeatable'].values())}",
                      flush=True)
    write_results(args.out, device, "deterministic-split", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
