"""The gather ceiling of the MSDA forward and the scatter ceiling of its
backward on this GPU (research/gather.py, research/scatter.py).

    python research/gather_ceiling.py [--presets encoder,decoder] [--dtypes bf16,fp32]
        [--tiles 2x16x1,8x16x4] [--scatter-tiles 1x64x1] [--out benchmarks]

For each preset and dtype: the forward of msda_mm, a kernel that only
gathers and sums the same corner rows, and the same kernel reading each
distinct row once (shuffled and sorted: with a cold L2, the bytes any
forward must read from DRAM, read by a kernel doing nothing else); then
msda_mm's backward, the zero fill of its grad_value, a kernel that only
does the backward's atomic row-adds (into a buffer filled once), and the
fill followed by those atomics (the backward's floor).  Each is timed as the benchmark times
(CUDA-graph replay after an L2 flush, and CUPTI kernel time), with the
gathered (or atomically added) bytes per microsecond.  Writes
<out>/<device-slug>-gather-ceiling.json and prints a table.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Runs as `python research/gather_ceiling.py` from a checkout, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.op.cli import names, tiles  # noqa: E402
from bench.op.inputs import make_inputs  # noqa: E402
from bench.op.presets import PRESETS  # noqa: E402
from bench.op.report import slug, write_json  # noqa: E402
from bench.op.run import DTYPES  # noqa: E402
from bench.op.timing import graph_times_us, kernel_times_us  # noqa: E402
from msda_mm import multi_scale_deformable_attention  # noqa: E402
from msda_mm.ops import resolve_fp32_grad_accum  # noqa: E402
from msda_mm.ops.backward.launcher import launch_backward  # noqa: E402
from msda_mm.parity.report import device_name, environment  # noqa: E402
from research.gather import corner_rows, distinct_rows, gather_sum  # noqa: E402
from research.scatter import scatter_add, zeroed  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    tile_list = tiles("BLOCK_QxBLOCK_RxWARPS", "2x16x1")
    parser.add_argument("--presets", type=names(PRESETS), default=("encoder", "decoder"))
    parser.add_argument("--dtypes", type=names(DTYPES), default=("bf16", "fp32"))
    parser.add_argument("--tiles", type=tile_list, default=[(2, 16, 1), (8, 16, 4), (16, 16, 4)],
                        help="gather kernel tiles BLOCK_QxBLOCK_RxWARPS (default "
                             "2x16x1,8x16x4,16x16x4)")
    # BLOCK_R counts corner rows, 4 a point: the backward's own chunks are 1
    # query x 16 points (16-bit: 64 rows) and 1 x 8 (fp32: 32 rows).
    parser.add_argument("--scatter-tiles", type=tile_list, default=[(1, 64, 1), (1, 32, 1)],
                        help="scatter kernel tiles BLOCK_QxBLOCK_RxWARPS, BLOCK_R in corner "
                             "rows (default 1x64x1,1x32x1)")
    parser.add_argument("--budget-ms", type=float, default=200.0,
                        help="timing budget per measurement (default 200)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks"))
    return parser.parse_args(argv)


def measure(fn, device: torch.device, budget_ms: float, nbytes: int) -> dict:
    cold, _ = graph_times_us(fn, device, budget_ms)
    kernel = kernel_times_us(fn, device)
    return dict(graph_us=cold, kernel_us=kernel, gbps_graph=nbytes / cold / 1e3,
                gbps_kernel=nbytes / kernel / 1e3)


def _backward_runs(inputs, rows: torch.Tensor, tiles) -> dict:
    """The backward's cells, as {name: (fn, bytes moved)}: msda_mm's backward
    (grad_value accumulated as the op picks on this GPU), its zero fill
    alone (and PyTorch's, torch.zeros, for comparison), and per scatter tile
    the atomics alone (into one buffer, filled once) and fill + atomics.
    Bytes: the atomically added rows (in the accumulation dtype), or the
    fill's buffer."""
    value = inputs.value
    gen = torch.Generator(value.device).manual_seed(0)
    grad_out = torch.randn(*inputs.attention_weights.shape[:2], value.shape[2] * value.shape[3],
                           device=value.device, generator=gen).to(value.dtype)
    fp32_accum = resolve_fp32_grad_accum(value, None)
    accum_dtype = torch.float32 if fp32_accum else value.dtype
    src = grad_out.view(rows.shape[0], value.shape[3])
    filled = torch.zeros(value.shape, dtype=accum_dtype, device=value.device)
    nbytes = rows.numel() * value.shape[3] * filled.element_size()

    def fill():
        return zeroed(value.shape, accum_dtype, value.device)

    fill_bytes = filled.numel() * filled.element_size()
    runs = {"msda_mm backward": (lambda: launch_backward(
                grad_out, value, inputs.spatial_shapes,
                inputs.sampling_locations, inputs.attention_weights, fp32_accum), nbytes),
            "zero fill": (fill, fill_bytes),
            "torch.zeros": (lambda: torch.zeros(value.shape, dtype=accum_dtype,
                                                device=value.device), fill_bytes)}
    for bq, br, nw in tiles:
        runs[f"scatter {bq}x{br}x{nw}"] = (
            lambda bq=bq, br=br, nw=nw: scatter_add(filled, rows, src, bq, br, nw), nbytes)
        runs[f"fill + scatter {bq}x{br}x{nw}"] = (
            lambda bq=bq, br=br, nw=nw: scatter_add(fill(), rows, src, bq, br, nw), nbytes)
    return runs


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("research/gather_ceiling.py times CUDA kernels: it needs a GPU")
    device = torch.device("cuda")
    cells = []
    for name in args.presets:
        host = make_inputs(PRESETS[name], "uniform", seed=0)
        for dname in args.dtypes:
            inputs = host.to(device, DTYPES[dname])
            value = inputs.value
            rows = corner_rows(inputs)
            nbytes = PRESETS[name].gathered_bytes(value.element_size())
            runs = {"msda_mm forward": (lambda inputs=inputs: multi_scale_deformable_attention(
                inputs.value, inputs.spatial_shapes, inputs.level_start_index,
                inputs.sampling_locations, inputs.attention_weights), nbytes)}
            for bq, br, nw in args.tiles:
                runs[f"gather {bq}x{br}x{nw}"] = (
                    lambda bq=bq, br=br, nw=nw, value=value, rows=rows:
                    gather_sum(value, rows, bq, br, nw), nbytes)
            # 1 x 64 rows x 1 warp: the fastest of 3 tiles on the H200 (docs/design.md).
            for order, shuffle in (("shuffled", True), ("sorted", False)):
                once = distinct_rows(rows, 64, shuffle)
                runs[f"distinct rows once, {order}"] = (
                    lambda once=once, value=value: gather_sum(value, once, 1, 64),
                    once.numel() * value.shape[-1] * value.element_size())
            runs.update(_backward_runs(inputs, rows, args.scatter_tiles))
            for kernel, (fn, moved) in runs.items():
                # moved_mb: the rows gathered or atomically added (the fill: grad_value).
                cell = dict(preset=name, dtype=dname, kernel=kernel, moved_mb=moved / 1e6,
                            **measure(fn, device, args.budget_ms, moved))
                cells.append(cell)
                print(f"{name:13s} {dname:5s} {kernel:30s} graph {cell['graph_us']:8.1f} us "
                      f"({cell['gbps_graph']:6.0f} GB/s)  kernel {cell['kernel_us']:8.1f} us "
                      f"({cell['gbps_kernel']:6.0f} GB/s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{slug(device_name(device))}-gather-ceiling.json"
    write_json(path, dict(environment=environment(device), tiles=args.tiles,
                          scatter_tiles=args.scatter_tiles), cells)
    print(f"Written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
