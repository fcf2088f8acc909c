"""How many more pixels GraphedDINO's canvases make a step compute on than
the batches' own size, from the sizes a config's training pipeline gives
(CPU only; no model is built).

    python -m bench.step.canvas_padding CONFIG [--batch-size N] [--batches K]
        [--cfg-options k=v ...]

An eager step computes on each batch padded to its largest image (rounded
up to the data preprocessor's pad_size_divisor), a graphed step on the
smallest of ``model.canvas_sizes`` that holds it: the backbone and encoder,
most of a step's GPU time, grow with those pixels.  The batches are the
config's train loader's (its sampler, batch sampler and pipeline), without
worker processes.
"""
from __future__ import annotations

import argparse
from collections import Counter
from typing import Iterable, Sequence, Tuple

from mmengine.config import Config, DictAction

from msda_mm.models.dino.padded_batch import bucket


def round_up(size: int, divisor: int) -> int:
    return -(-size // divisor) * divisor


def batch_size_of(shapes: Sequence[Tuple[int, int]], divisor: int) -> Tuple[int, int]:
    """The (H, W) an eager step pads the images of ``shapes`` to."""
    return (round_up(max(h for h, _ in shapes), divisor),
            round_up(max(w for _, w in shapes), divisor))


def padding_summary(batches: Iterable[Tuple[Sequence[Tuple[int, int]], int]],
                    canvas_sizes: Sequence[Tuple[int, int]], gt_caps: Sequence[int],
                    divisor: int = 1) -> dict:
    """Totals over ``batches`` ((H, W) of each image, the most GT boxes of an
    image): pixels of the images, of the eager step's padded batch and of
    the graphed step's canvas (a batch that fits no bucket counts its eager
    size, as it runs eagerly); the keys met, with their batch counts."""
    images = eager = graphed = 0
    keys: Counter = Counter()
    outside = 0
    for shapes, most in batches:
        height, width = batch_size_of(shapes, divisor)
        images += sum(h * w for h, w in shapes)
        eager += len(shapes) * height * width
        fit = bucket(canvas_sizes, gt_caps, height, width, most)
        if fit is None:
            outside += 1
            graphed += len(shapes) * height * width
        else:
            keys[(len(shapes), *fit)] += 1
            graphed += len(shapes) * fit[0] * fit[1]
    return dict(image_pixels=images, eager_pixels=eager, graphed_pixels=graphed,
                keys=dict(keys), outside_buckets=outside)


def loader_batches(cfg: Config, count: int):
    """(image sizes, most GT boxes of an image) of the first ``count``
    batches of ``cfg``'s train loader, built in this process."""
    from mmengine.registry import init_default_scope
    from mmengine.runner import Runner

    import msda_mm.datasets  # noqa: F401  (SyntheticShapesDataset, mmcv-lite shims)

    init_default_scope(cfg.get("default_scope", "mmdet"))
    loader_cfg = cfg.train_dataloader.copy()
    loader_cfg.update(num_workers=0, persistent_workers=False, pin_memory=False)
    for i, data in enumerate(Runner.build_dataloader(loader_cfg, seed=0)):
        if i == count:
            return
        yield ([tuple(image.shape[-2:]) for image in data["inputs"]],
               max((len(s.gt_instances) for s in data["data_samples"]), default=0))


def markdown(summary: dict, config: str, batch_size: int) -> str:
    keys = ", ".join(f"{key}: {n}" for key, n in sorted(summary["keys"].items(),
                                                         key=lambda kv: -kv[1]))
    batches = sum(summary["keys"].values()) + summary["outside_buckets"]
    return "\n".join([
        f"# Canvas padding: {config}, batch {batch_size}, {batches} batches",
        "",
        "| graphed / eager pixels | graphed / image pixels | eager / image pixels "
        "| batches outside the buckets |",
        "| --- | --- | --- | --- |",
        f"| {summary['graphed_pixels'] / summary['eager_pixels']:.2f} "
        f"| {summary['graphed_pixels'] / summary['image_pixels']:.2f} "
        f"| {summary['eager_pixels'] / summary['image_pixels']:.2f} "
        f"| {summary['outside_buckets']} |",
        "",
        f"Keys (B, H, W, G) met, with their batches: {keys or 'none'}",
    ]) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.step.canvas_padding",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="images per batch (default: the config's)")
    parser.add_argument("--batches", type=int, default=50, help="batches read (default 50)")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, default=None)
    args = parser.parse_args(argv)
    if args.batches < 1 or (args.batch_size is not None and args.batch_size < 1):
        parser.error(f"--batches and --batch-size must be >= 1, got {args.batches} and "
                     f"{args.batch_size}")
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if "canvas_sizes" not in cfg.model:
        parser.error(f"{args.config}'s model has no canvas_sizes (not a GraphedDINO config)")
    if args.batch_size is not None:
        cfg.train_dataloader.batch_size = args.batch_size
    divisor = cfg.model.get("data_preprocessor", {}).get("pad_size_divisor", 1)
    summary = padding_summary(loader_batches(cfg, args.batches), cfg.model.canvas_sizes,
                              cfg.model.gt_caps, divisor)
    print(markdown(summary, args.config, cfg.train_dataloader.batch_size), end="")


if __name__ == "__main__":
    main()
