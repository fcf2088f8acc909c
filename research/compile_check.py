#!/usr/bin/env python
"""Compile every MSDA kernel variant for sm_80 / sm_90 without a GPU and
print what the code generator made of it: the backward's atomics (PTX and
SASS, CAS loop or not), those of the deterministic backward's grad_value
kernels, and the forward's load widths, with registers and spills.  Exits
non-zero if any variant fails to compile.

    python research/compile_check.py [--archs 80 90] [--softmax] [--json out.json] [--dump DIR]
    python research/compile_check.py --variants rows.json [--json ...] [--dump ...]

--variants compiles the variants of the rows in a --json file (of an earlier
run, or any list of the codegen.Variant fields) instead of the product of
--archs, --dtypes, --head-dims, --kernels and --softmax.

--dump writes each variant's PTX (without debug information) and SASS, so
that two checkouts' code can be diffed: ``diff -r DIR_A DIR_B``.
"""
import os

# Interpreted kernels cannot be compiled, and this tool only compiles: turn
# the interpreter off before msda_mm creates its kernels (workers inherit it).
os.environ.pop("TRITON_INTERPRET", None)

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import sys  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

# Runs as `python research/compile_check.py` from a checkout, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from research import codegen as cc  # noqa: E402

BWD_COLUMNS = ("arch", "dtype", "head_dim", "accum", "softmax", "ptx_atomics", "sass_atomics",
               "cas_loop", "pdl_waits", "exps", "regs", "spill_stores", "spill_loads", "seconds")
DET_COLUMNS = ("kernel", "arch", "dtype", "head_dim", "ptx_atomics", "sass_atomics", "cas_loop",
               "regs", "spill_stores", "spill_loads", "seconds")
FWD_COLUMNS = ("arch", "dtype", "head_dim", "softmax", "ptx_loads", "sass_loads", "exps", "regs",
               "spill_stores", "spill_loads", "seconds")


def _cell(row: dict, column: str) -> str:
    if row["error"] and column not in ("kernel", "arch", "dtype", "head_dim", "accum",
                                       "softmax"):
        return "FAILED" if column in ("ptx_atomics", "ptx_loads") else ""
    value = row[column]
    if isinstance(value, dict):
        return ", ".join(f"{n}x {op}" for op, n in sorted(value.items()))
    return str(value)


def print_table(title: str, rows: list, columns: tuple) -> None:
    if not rows:
        return
    cells = [columns] + [tuple(_cell(r, c) for c in columns) for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    print(f"\n{title}")
    for line in cells:
        print(" | ".join(text.ljust(w) for text, w in zip(line, widths)).rstrip())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--archs", type=int, nargs="+", default=[80, 90])
    p.add_argument("--dtypes", nargs="+", choices=list(cc.DTYPES), default=list(cc.DTYPES))
    # 24: not a power of two (masked tail of the D tile) nor 16-divisible.
    p.add_argument("--head-dims", type=int, nargs="+", default=[cc.SHAPE.head_dim, 24])
    p.add_argument("--kernels", nargs="+", choices=cc.KERNELS, default=list(cc.KERNELS))
    p.add_argument("--softmax", action="store_true",
                   help="also compile the kernels that take softmax over attention logits")
    p.add_argument("--variants", type=Path,
                   help="compile the variants of these rows (a --json file) instead")
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--dump", type=Path, help="write <variant>.ptx and .sass into this folder")
    args = p.parse_args(argv)

    if args.variants:
        todo = [cc.Variant.of(row) for row in json.loads(args.variants.read_text())]
    else:
        todo = cc.variants(args.archs, args.dtypes, args.head_dims, args.kernels,
                           (False, True) if args.softmax else (False,))
    if not todo:
        p.error("no kernel variant for these arguments (fwd_pairs takes fp16/bf16 and even "
                "head dims)")
    # Compilation is single-threaded and CPU-bound; spawn, not fork, so no
    # worker inherits the parent's torch/MLIR state.
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
        rows = list(pool.map(functools.partial(cc.compile_variant, dump=args.dump), todo))

    print(f"triton {rows[0]['triton']}, {len(rows)} variants")
    print_table("backward: grad_value atomics", [r for r in rows if r["kernel"] == "bwd"],
                BWD_COLUMNS)
    print_table("deterministic backward: grad_value kernels",
                [r for r in rows if r["kernel"] in cc.DET_KERNELS], DET_COLUMNS)
    for kernel in ("fwd", "fwd_pairs"):
        print_table(f"{kernel}: global loads", [r for r in rows if r["kernel"] == kernel],
                    FWD_COLUMNS)
    failed = [r for r in rows if r["error"]]
    for r in failed:
        print(f"\nFAILED {r['kernel']} sm_{r['arch']} {r['dtype']} D={r['head_dim']} {r['accum']}"
              f"{' softmax' if r['softmax'] else ''}:"
              f"\n{r['error']}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
