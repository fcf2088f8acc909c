"""The gather ceiling of the MSDA forward on this GPU (msda_mm/bench/gather.py).

    python tools/gather_ceiling.py [--presets encoder,decoder] [--dtypes bf16,fp32]
        [--tiles 2x16x1,8x16x4] [--out benchmarks]

For each preset and dtype: the forward of msda_mm and a kernel that only
gathers and sums the same corner rows, each timed as the benchmark times
(CUDA-graph replay after an L2 flush, and CUPTI kernel time), with the
gathered bytes per microsecond of each.  Writes
<out>/<device-slug>-gather-ceiling.json and prints a table.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Runs as `python tools/gather_ceiling.py` from a checkout, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from msda_mm import multi_scale_deformable_attention  # noqa: E402
from msda_mm.bench.cli import names  # noqa: E402
from msda_mm.bench.gather import corner_rows, gather_sum  # noqa: E402
from msda_mm.bench.inputs import make_inputs  # noqa: E402
from msda_mm.bench.presets import PRESETS  # noqa: E402
from msda_mm.bench.report import device_name, environment, slug, write_json  # noqa: E402
from msda_mm.bench.run import DTYPES  # noqa: E402
from msda_mm.bench.timing import graph_times_us, kernel_times_us  # noqa: E402


def _tiles(text: str) -> list[tuple[int, int, int]]:
    try:
        tiles = [tuple(int(n) for n in t.split("x")) for t in text.split(",")]
        if not tiles or any(len(t) != 3 or min(t) < 1 for t in tiles):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected BLOCK_QxBLOCK_RxWARPS[,...], e.g. 2x16x1") from None
    return tiles


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", type=names(PRESETS), default=("encoder", "decoder"))
    parser.add_argument("--dtypes", type=names(DTYPES), default=("bf16", "fp32"))
    parser.add_argument("--tiles", type=_tiles, default=[(2, 16, 1), (8, 16, 4), (16, 16, 4)],
                        help="gather kernel tiles BLOCK_QxBLOCK_RxWARPS (default "
                             "2x16x1,8x16x4,16x16x4)")
    parser.add_argument("--budget-ms", type=float, default=200.0,
                        help="timing budget per measurement (default 200)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks"))
    return parser.parse_args(argv)


def measure(fn, device: torch.device, budget_ms: float, nbytes: int) -> dict:
    cold, _ = graph_times_us(fn, device, budget_ms)
    kernel = kernel_times_us(fn, device)
    return dict(graph_us=cold, kernel_us=kernel, gbps_graph=nbytes / cold / 1e3,
                gbps_kernel=nbytes / kernel / 1e3)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("tools/gather_ceiling.py times CUDA kernels: it needs a GPU")
    device = torch.device("cuda")
    cells = []
    for name in args.presets:
        host = make_inputs(PRESETS[name], "uniform", seed=0)
        for dname in args.dtypes:
            inputs = host.to(device, DTYPES[dname])
            value = inputs.value
            rows = corner_rows(inputs)
            nbytes = PRESETS[name].gathered_bytes(value.element_size())
            runs = {"msda_mm forward": lambda: multi_scale_deformable_attention(
                value, inputs.spatial_shapes, inputs.level_start_index,
                inputs.sampling_locations, inputs.attention_weights)}
            for bq, br, nw in args.tiles:
                runs[f"gather {bq}x{br}x{nw}"] = (
                    lambda bq=bq, br=br, nw=nw: gather_sum(value, rows, bq, br, nw))
            for kernel, fn in runs.items():
                cell = dict(preset=name, dtype=dname, kernel=kernel, gathered_mb=nbytes / 1e6,
                            **measure(fn, device, args.budget_ms, nbytes))
                cells.append(cell)
                print(f"{name:13s} {dname:5s} {kernel:22s} graph {cell['graph_us']:8.1f} us "
                      f"({cell['gbps_graph']:6.0f} GB/s)  kernel {cell['kernel_us']:8.1f} us "
                      f"({cell['gbps_kernel']:6.0f} GB/s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{slug(device_name(device))}-gather-ceiling.json"
    write_json(path, dict(environment=environment(device), tiles=args.tiles), cells)
    print(f"Written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
