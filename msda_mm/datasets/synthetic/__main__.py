"""Command line: ``python -m msda_mm.datasets.synthetic --out data/synthetic
--num-train 1000 --num-val 100 --size 512 512 [--seed 0] [--workers N]``."""
import argparse

from .writer import ensure_generated


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m msda_mm.datasets.synthetic",
        description="Write the deterministic synthetic shapes detection dataset "
                    "(COCO format) that the configs/synthetic/ configs train on, unless "
                    "the folder holds it already (written by a run before, or by one "
                    "running at the same time).")
    parser.add_argument("--out", default="data/synthetic", help="dataset root to write")
    parser.add_argument("--num-train", type=int, default=1000)
    parser.add_argument("--num-val", type=int, default=100)
    parser.add_argument("--size", type=int, nargs=2, default=(512, 512), metavar=("H", "W"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None,
                        help="drawing threads (default: usable cores, at most 16); "
                             "the output does not depend on it")
    args = parser.parse_args(argv)
    try:
        wrote = ensure_generated(args.out, args.num_train, args.num_val, args.size, args.seed,
                                 args.workers)
    except ValueError as error:
        parser.error(str(error))
    what = (f"{args.num_train} train + {args.num_val} val images of "
            f"{args.size[0]}x{args.size[1]}")
    print(f"wrote {what} to {args.out}" if wrote else
          f"{args.out} already holds {what} of these arguments: left as it is")


if __name__ == "__main__":
    main()
