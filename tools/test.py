"""Evaluate a checkpoint: ``python tools/test.py CONFIG CHECKPOINT
[--work-dir DIR] [--out results.pkl] [--show-dir DIR] [--cfg-options k=v ...]
[--launcher {none,pytorch,slurm,mpi}]`` -- mmdet's tools/test.py command
line, run by mmengine's Runner; prints the config's metrics (the COCO AP
table for CocoMetric)."""
from __future__ import annotations

import argparse

from common import add_common_args, build_runner, load_config


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Test (and evaluate) a detector")
    parser.add_argument("config", help="test config file")
    parser.add_argument("checkpoint", help="checkpoint file")
    add_common_args(parser)
    parser.add_argument("--out", help="also dump the predictions to this .pkl file")
    parser.add_argument("--show-dir", help="draw predictions and ground truth into this "
                        "directory (under the run's work_dir/timestamp)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.out is not None and not args.out.endswith((".pkl", ".pickle")):
        raise SystemExit(f"--out must name a .pkl or .pickle file, got {args.out}")
    cfg = load_config(args)
    cfg.load_from = args.checkpoint
    if args.show_dir:
        if "visualization" not in cfg.get("default_hooks", {}):
            raise SystemExit("--show-dir needs default_hooks.visualization in the config "
                             "(e.g. dict(type='DetVisualizationHook'))")
        cfg.default_hooks.visualization.update(draw=True, test_out_dir=args.show_dir)
    runner = build_runner(cfg)
    if args.out is not None:
        # Here, not at the top: mmdet.evaluation imports mmcv.ops, which
        # needs the shims that build_runner (importing msda_mm) installs first.
        from mmdet.evaluation import DumpDetResults
        runner.test_evaluator.metrics.append(DumpDetResults(out_file_path=args.out))
    runner.test()


if __name__ == "__main__":
    main()
