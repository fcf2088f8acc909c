"""Which shape keys of a GraphedDINO config make torch.compile compile
again, counted on CPU (no GPU needed).

    python -m bench.step.compile_keys CONFIG --keys B,H,W,G [B,H,W,G ...]
        [--backend NAME] [--cfg-options k=v ...]

A graphed step's first run at a new key is eager, and it compiles whatever
torch.compile's guards refuse for the new shapes: the submodules the
config's CompileSubmodulesHook names and the head's compiled losses.  This
tool builds the config's model (initialised, no pretrained weights),
compiles those submodules, and runs GraphedDINO's training step once per
``--keys`` entry, in order: a batch of B synthetic H x W images with G GT
boxes each.  As each step ends it prints the graphs torch.compile
compiled (dynamo's unique graphs: a frame compiles one graph, more where
it breaks) and the step's seconds.

On CPU GraphedDINO runs every step eagerly (no capture), so each step
compiles what a key's first step compiles on a GPU.  The MSDA op takes its
compiled path, the custom ops that torch.compile does not trace into, with
their kernels replaced by the PyTorch reference (forward) and zeros
(backward): what compiles is decided by torch.compile's guards on the
same shapes as on a GPU, the seconds are this CPU's (``--backend eager``
counts the submodules' graphs without generating code).  The optimizer
wrapper is made fp32 (AMP's autocast changes dtypes, not the shapes the
guards check).
"""
from __future__ import annotations

import argparse
import time
from contextlib import contextmanager
from typing import Iterator, Sequence, Tuple
from unittest import mock

import torch
from mmengine.config import Config, DictAction

Key = Tuple[int, int, int, int]


def parse_key(text: str) -> Key:
    """"B,H,W,G" as four positive ints."""
    try:
        key = tuple(int(v) for v in text.split(","))
    except ValueError:
        key = ()
    if len(key) != 4 or min(key) < 1:
        raise argparse.ArgumentTypeError(f"a key is B,H,W,G: four positive integers (images, "
                                         f"height, width, GT boxes per image), got {text!r}")
    return key


@contextmanager
def stubbed_msda_kernels() -> Iterator[None]:
    """msda_mm's op on CPU tensors as on CUDA ones under torch.compile (its
    custom ops), their kernels replaced by the reference forward and a zero
    backward; eager calls outside compiled code run the reference."""
    from msda_mm.ops import op
    from msda_mm.ops.reference import msda_reference, point_softmax

    def forward(value, spatial_shapes, locations, weights, softmax, tiles):
        weights = point_softmax(weights) if softmax else weights
        out = msda_reference(value, spatial_shapes, locations, weights)
        return out.to(value.dtype).contiguous()

    def backward(grad_output, value, spatial_shapes, locations, weights, *rest):
        return torch.zeros_like(value), torch.zeros_like(locations), torch.zeros_like(weights)

    with mock.patch.object(op, "_use_triton", lambda t: torch.compiler.is_compiling()), \
            mock.patch.object(op, "_forward_impl", forward), \
            mock.patch.object(op, "_backward_impl", backward):
        yield


def build(cfg: Config, backend: str | None):
    """The config's model, its CompileSubmodulesHook's submodules compiled
    (with ``backend`` where given), and an fp32 optimizer wrapper."""
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope
    from mmengine.utils import import_modules_from_strings

    import_modules_from_strings(**cfg.get("custom_imports", dict(imports=["msda_mm"])))
    init_default_scope(cfg.get("default_scope", "mmdet"))
    from mmdet.registry import MODELS

    from msda_mm.engine.compile_submodules_hook import compile_submodules

    model_cfg = cfg.model.copy()
    if model_cfg.get("backbone", {}).get("init_cfg") is not None:
        model_cfg.backbone.init_cfg = None  # no pretrained download
    torch.manual_seed(0)
    model = MODELS.build(model_cfg)
    model.init_weights()
    model.train()
    for hook in cfg.get("custom_hooks", []):
        if hook.get("type") == "CompileSubmodulesHook":
            kwargs = {k: v for k, v in hook.items() if k not in ("type", "modules", "priority")}
            if backend is not None:
                kwargs["backend"] = backend
            compile_submodules(model, hook["modules"], **kwargs)
    wrapper_cfg = cfg.optim_wrapper.copy()
    for name in ("dtype", "loss_scale"):
        wrapper_cfg.pop(name, None)
    wrapper_cfg.type = "OptimWrapper"
    return model, build_optim_wrapper(model, wrapper_cfg)


def batch(key: Key, num_classes: int) -> dict:
    """B synthetic H x W images with G GT boxes each, as the loader gives them."""
    from mmdet.testing import demo_mm_inputs

    images, height, width, boxes = key
    return demo_mm_inputs(batch_size=images, image_shapes=[(3, height, width)] * images,
                          num_items=[boxes] * images, num_classes=num_classes)


def count_compiles(model, optim_wrapper, keys: Sequence[Key]) -> Iterator[dict]:
    """Per key, in order, once its step has run: the key GraphedDINO gives
    it (None: eager, no bucket), the graphs its step compiled, and the
    step's seconds."""
    from torch._dynamo.utils import counters

    from msda_mm.models.dino.padded_batch import bucket

    from .canvas_padding import batch_size_of

    divisor = getattr(model.data_preprocessor, "pad_size_divisor", 1)
    torch._dynamo.reset()  # nothing compiled before counts
    with stubbed_msda_kernels():
        for key in keys:
            images, height, width, boxes = key
            fit = bucket(model.canvas_sizes, model.gt_caps,
                         *batch_size_of([(height, width)], divisor), boxes)
            graphs = counters["stats"]["unique_graphs"]
            start = time.perf_counter()
            model.train_step(batch(key, model.bbox_head.num_classes), optim_wrapper)
            yield dict(key=key, step_key=None if fit is None else (images, *fit),
                       compiled=counters["stats"]["unique_graphs"] - graphs,
                       seconds=time.perf_counter() - start)


def header(config: str, backend: str | None) -> str:
    return "\n".join([
        f"# Compiles per shape key: {config}" + (f" (backend {backend})" if backend else ""), "",
        "| step | images, H, W, GT boxes | key (B, H, W, G) | graphs compiled | seconds |",
        "| --- | --- | --- | --- | --- |"])


def row_line(step: int, row: dict) -> str:
    key = "eager (no bucket)" if row["step_key"] is None else str(row["step_key"])
    return (f"| {step} | {', '.join(map(str, row['key']))} | {key} | {row['compiled']} "
            f"| {row['seconds']:.1f} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.step.compile_keys",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--keys", type=parse_key, nargs="+", required=True, metavar="B,H,W,G",
                        help="the steps' batches, in order: images, height, width, GT boxes "
                             "per image")
    parser.add_argument("--backend", default=None,
                        help="torch.compile backend of the hook's submodules (default: the "
                             "config's, inductor unless it names one)")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, default=None)
    args = parser.parse_args(argv)
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if "canvas_sizes" not in cfg.model:
        parser.error(f"{args.config}'s model has no canvas_sizes (not a GraphedDINO config)")
    model, optim_wrapper = build(cfg, args.backend)
    print(header(args.config, args.backend), flush=True)
    for step, row in enumerate(count_compiles(model, optim_wrapper, args.keys)):
        print(row_line(step, row), flush=True)


if __name__ == "__main__":
    main()
