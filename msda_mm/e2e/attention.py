"""Which implementation a model's multi-scale deformable attention runs, and
what each attention layer outputs.

Both sides of a parity run are one model object: ``TritonMSDeformAttn``
subclasses mmcv's ``MultiScaleDeformableAttention`` without adding state, so
switching an instance's class switches only ``forward``.  Same weights, same
buffers, same checkpoint, nothing rebuilt.

The mmcv side is mmcv's own ``forward``.  For CUDA tensors that calls
``MultiScaleDeformableAttnFunction.apply``: mmcv's CUDA kernels where mmcv is
compiled, but on mmcv-lite ``msda_mm.compat`` routes it to msda_mm's Triton
op, which would compare the op with itself.  So on mmcv-lite the mmcv side
sends that call to mmcv's ``multi_scale_deformable_attn_pytorch`` instead,
the function mmcv's ``forward`` uses for CPU tensors anyway.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Iterator

import torch
from torch import nn

from ..compat import MMCV_LITE
from ..models import TritonMSDeformAttn
from ..ops import launch

# isort: split
from mmcv.ops import MultiScaleDeformableAttention, multi_scale_deform_attn

OPS = ("triton", "mmcv")
_CLASSES = {"triton": TritonMSDeformAttn, "mmcv": MultiScaleDeformableAttention}


def describe(op: str, device: torch.device) -> str:
    """What ``op`` computes with on ``device``, for reports."""
    if op == "triton":
        if device.type == "cuda":
            return "msda_mm Triton kernels"
        if launch.interpreter_enabled():
            return "msda_mm Triton kernels (Triton interpreter)"
        return "msda_mm PyTorch reference (CPU)"
    if device.type == "cuda" and not MMCV_LITE:
        return "mmcv CUDA kernels (compiled mmcv)"
    return "mmcv multi_scale_deformable_attn_pytorch"


def msda_modules(model: nn.Module) -> dict[str, MultiScaleDeformableAttention]:
    """Every multi-scale deformable attention of ``model``, by module name."""
    return {name: m for name, m in model.named_modules()
            if isinstance(m, MultiScaleDeformableAttention)}


def _mmcv_pytorch_sampler(value, spatial_shapes, level_start_index, sampling_locations,
                          attention_weights, im2col_step):
    # The arguments of MultiScaleDeformableAttnFunction.apply, handed to the
    # function mmcv's forward calls for CPU tensors.
    return multi_scale_deform_attn.multi_scale_deformable_attn_pytorch(
        value, spatial_shapes, sampling_locations, attention_weights)


@contextmanager
def _mmcv_pytorch_on_cuda() -> Iterator[None]:
    function = multi_scale_deform_attn.MultiScaleDeformableAttnFunction
    routed = vars(function)["apply"]  # msda_mm.compat's route to the Triton op
    function.apply = staticmethod(_mmcv_pytorch_sampler)
    try:
        yield
    finally:
        function.apply = routed


@contextmanager
def use_op(model: nn.Module, op: str) -> Iterator[None]:
    """Run every MSDA module of ``model`` with ``op`` ('triton' or 'mmcv')
    inside the block; the modules' classes are restored on exit."""
    if op not in _CLASSES:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    modules = msda_modules(model).values()
    if not modules:
        raise ValueError("the model has no MultiScaleDeformableAttention module to compare")
    classes = [type(m) for m in modules]
    for m in modules:
        m.__class__ = _CLASSES[op]
    try:
        with _mmcv_pytorch_on_cuda() if op == "mmcv" and MMCV_LITE else nullcontext():
            yield
    finally:
        for m, cls in zip(modules, classes):
            m.__class__ = cls


@contextmanager
def recorded_outputs(model: nn.Module) -> Iterator[dict[str, list[torch.Tensor]]]:
    """Inside the block, every output of every MSDA module of ``model`` is
    appended (detached, on the CPU, fp32) to the yielded dict's list for it."""
    outputs: dict[str, list[torch.Tensor]] = {}

    def hook(name):
        return lambda module, args, output: outputs.setdefault(name, []).append(
            output.detach().float().cpu())

    handles = [m.register_forward_hook(hook(name)) for name, m in msda_modules(model).items()]
    try:
        yield outputs
    finally:
        for h in handles:
            h.remove()
