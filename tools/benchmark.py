"""Benchmark msda_mm's MSDA op against the PyTorch reference, mmcv's and other packages' ops.

    python tools/benchmark.py                      # whole matrix on cuda -> benchmarks/
    python tools/benchmark.py --out benchmarks $OUT --targets targets.json
    python tools/benchmark.py --device cpu --presets tiny --impl msda_mm,reference
    python tools/benchmark.py --presets decoder,dino_decoder,encoder --impl msda_mm,msda_mm_det
    python tools/benchmark.py --presets encoder --impl msda_mm,deformops   # pip install deformops
    python tools/benchmark.py --presets encoder --impl msda_mm,msda_triton

Writes <out>/<device-slug>.json, .csv and .png for each --out folder and
prints a table.  The JSON and CSV are rewritten after every cell, so that a
run stopped early keeps the cells it finished; the JSON says
"finished": false until the run ends.  Methods: bench/op/timing.py and
cell.METHOD (copied into the JSON).
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

# Runs as `python tools/benchmark.py` from a checkout (bench/ is never
# installed), msda_mm installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_ACCUM = {"auto": None, "on": True, "off": False}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", help="comma-separated names of bench/op/presets.py "
                                     "(default: every preset but tiny)")
    p.add_argument("--dtypes", help="value dtypes, of fp32,fp16,bf16 (default: all); "
                                    "locations and weights are always fp32")
    p.add_argument("--locations", help="sampling-location distributions, of "
                                       "uniform,clustered (default: both)")
    p.add_argument("--impl", help="of msda_mm,msda_mm_det,reference,mmcv,mmcv_cuda,deformops,"
                                  "msda_triton "
                                  "(default: all); msda_mm_det: msda_mm with "
                                  "deterministic=True; mmcv: compiled mmcv's CUDA kernels; "
                                  "mmcv_cuda: on mmcv-lite, msda_mm's build of them "
                                  "(tools/build_mmcv_msda.py); else n/a, as for bf16; "
                                  "deformops: PyPI deformops' op (pip install deformops); "
                                  "msda_triton: roulbac/msda-triton's Triton op, CUDA only "
                                  "(pip install git+https://github.com/roulbac/msda-triton); "
                                  "else n/a")
    p.add_argument("--device", default="cuda",
                   help="cpu: smoke test, perf_counter wall times, no graphs or memory")
    p.add_argument("--fp32-grad-accum", choices=_ACCUM, default="auto",
                   help="msda_mm's grad_value accumulation (on: the pre-Hopper bf16 path)")
    p.add_argument("--out", type=Path, nargs="+", default=[Path("benchmarks")],
                   help="folders to write <device>.json/.csv/.png into")
    p.add_argument("--targets", help="JSON, inline or a file: see bench/op/targets.py")
    p.add_argument("--budget-ms", type=float, default=50.0,
                   help="time each timer repeats its call for (5 to 500 repetitions)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiles", default="",
                   help="extra msda_mm rows (and msda_mm_det rows where --impl has it) with "
                        "other tiles, e.g. '2x1,1x1;4x4x8,4x4x8' (forward, backward: "
                        "BLOCK_Q x warps [x BLOCK_P points per chunk]; a forward 'p8x1' is "
                        "msda_fwd_pairs_kernel's; ';' between rows)")
    args = p.parse_args(argv)
    # The names are checked against bench.op only now: --help answers
    # before torch and msda_mm load (seconds).
    import torch

    from bench.op.cli import names
    from bench.op.impls import IMPLS, MSDA_MM
    from bench.op.inputs import DISTRIBUTIONS
    from bench.op.presets import DEFAULT_PRESETS, PRESETS
    from bench.op.run import DTYPES

    for key, choices, default in (("presets", PRESETS, DEFAULT_PRESETS),
                                  ("dtypes", DTYPES, tuple(DTYPES)),
                                  ("locations", DISTRIBUTIONS, DISTRIBUTIONS),
                                  ("impl", IMPLS, IMPLS)):
        text = getattr(args, key)
        try:
            setattr(args, key, default if text is None else names(choices)(text))
        except argparse.ArgumentTypeError as error:
            p.error(f"argument --{key}: {error}")
    try:
        args.device = torch.device(args.device)
    except RuntimeError as error:
        p.error(f"argument --device: {error}")
    families = [impl for impl in MSDA_MM if impl == "msda_mm" or impl in args.impl]
    args.impl = args.impl + tuple(f"{impl}@{t}" for t in args.tiles.split(";") if t
                                  for impl in families)
    if args.device.type == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device here: use --device cpu for a smoke test")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    from bench.op.cell import METHOD
    from bench.op.plot import plot_times
    from bench.op.report import console_table, slug, write_csv, write_json
    from bench.op.run import Config, matrix_size, run_matrix
    from bench.op.targets import apply_targets, load_targets
    from bench.op.timing import autograd_floor_us, graph_floor_us
    from msda_mm.parity.report import device_name, environment

    targets = load_targets(args.targets) if args.targets else {}
    config = Config(args.presets, args.locations, args.dtypes, args.impl, args.device,
                    _ACCUM[args.fp32_grad_accum], args.budget_ms, args.seed)
    name = device_name(args.device)
    meta = dict(environment(args.device),
                command=shlex.join(["python", "tools/benchmark.py", *argv]),
                config=dict(presets=args.presets, locations=args.locations, dtypes=args.dtypes,
                            impl=args.impl, fp32_grad_accum=args.fp32_grad_accum,
                            budget_ms=args.budget_ms, seed=args.seed, targets=targets),
                method=METHOD, cells_planned=matrix_size(config), finished=False)

    def save(records: list[dict]) -> None:
        for folder in args.out:
            folder.mkdir(parents=True, exist_ok=True)
            write_json(folder / f"{slug(name)}.json", meta, records)
            write_csv(folder / f"{slug(name)}.csv", records)

    def on_cell(records: list[dict]) -> None:
        apply_targets(records[-1:], targets)  # the cells before have theirs
        save(records)

    start = time.perf_counter()
    records = run_matrix(config, log=lambda line: print(line, flush=True), on_cell=on_cell)
    meta.update(finished=True, wall_s=round(time.perf_counter() - start, 1),
                host_floor_fwdbwd_us=autograd_floor_us(args.device, args.budget_ms),
                graph_floor_us=(graph_floor_us(args.device, args.budget_ms)
                                if args.device.type == "cuda" else None))
    save(records)
    print(console_table(records))
    if meta["host_floor_fwdbwd_us"] is not None:
        print(f"host floor (x * 2 and its autograd.grad): {meta['host_floor_fwdbwd_us']:.1f} us")
    if meta["graph_floor_us"] is not None:
        print(f"graph floor (fwd_us's timer on one one-element fill): "
              f"{meta['graph_floor_us']:.1f} us")
    print(f"{len(records)} cells in {meta['wall_s']} s on {name}; results in "
          + ", ".join(str(folder / slug(name)) + ".{json,csv,png}" for folder in args.out))
    for folder in args.out:
        plot_times(records, folder / f"{slug(name)}.png", f"MSDA on {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
