"""Which implementation a model's multi-scale deformable attention runs, and
what each attention layer outputs.

Both sides of a parity run are one model object: ``TritonMSDeformAttn``
subclasses mmcv's ``MultiScaleDeformableAttention`` with no parameters or
buffers of its own, so switching an instance's class switches ``forward``
and the op's settings its ``__init__`` sets (``TRITON_SETTINGS``: given
their defaults on an mmcv module, which never ran it).  Same weights, same
buffers, same checkpoint, nothing rebuilt.

The mmcv side is mmcv's own ``forward``.  For CUDA tensors that calls
``MultiScaleDeformableAttnFunction.apply``, which runs, as ``MmcvSide``
says: mmcv's CUDA kernels ('cuda': compiled mmcv's, or on mmcv-lite
msda_mm's build of them from the mmcv sdist, ``msda_mm.compat.mmcv_cuda_switch``)
or mmcv's ``multi_scale_deformable_attn_pytorch`` ('pytorch', the function
mmcv's ``forward`` uses for CPU tensors anyway).  Never mmcv-lite's default
route of the Function to msda_mm's Triton op, which would compare the op
with itself.
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from types import ModuleType
from typing import ContextManager, Iterator, Optional

import torch
from torch import nn

from ..compat import MMCV_LITE, mmcv_cuda_build, mmcv_cuda_switch
from ..models import TritonMSDeformAttn
from ..ops.runtime import interpreter_enabled

# isort: split
from mmcv.ops import MultiScaleDeformableAttention, multi_scale_deform_attn

OPS = ("triton", "mmcv")
MMCV_KERNELS = ("cuda", "pytorch")
_CLASSES = {"triton": TritonMSDeformAttn, "mmcv": MultiScaleDeformableAttention}
# The op's settings TritonMSDeformAttn.__init__ sets, at its defaults (read
# from its signature, so that the two never disagree).
TRITON_SETTINGS = {name: inspect.signature(TritonMSDeformAttn.__init__).parameters[name].default
                   for name in ("fp32_grad_accum", "fp32_compute", "deterministic")}
_MMCV_PYTORCH = "mmcv multi_scale_deformable_attn_pytorch"
_COMPILED = "mmcv CUDA kernels (compiled mmcv)"


def _triton(device: torch.device) -> str:
    if device.type == "cuda":
        return "msda_mm Triton kernels"
    if interpreter_enabled():
        return "msda_mm Triton kernels (Triton interpreter)"
    return "msda_mm PyTorch reference (CPU)"


def mmcv_pytorch_sampler(value, spatial_shapes, level_start_index, sampling_locations,
                          attention_weights, im2col_step):
    # The arguments of MultiScaleDeformableAttnFunction.apply, handed to the
    # function mmcv's forward calls for CPU tensors.
    return multi_scale_deform_attn.multi_scale_deformable_attn_pytorch(
        value, spatial_shapes, sampling_locations, attention_weights)


@dataclass(frozen=True)
class MmcvSide:
    """What mmcv's MultiScaleDeformableAttention runs on CUDA tensors in a
    comparison: ``kernels`` 'cuda' (mmcv's own: ``module``, msda_mm's build
    of them on mmcv-lite; None with compiled mmcv) or 'pytorch'."""
    kernels: str = "pytorch"
    module: Optional[ModuleType] = None

    def route(self) -> ContextManager:
        """Inside the block mmcv's Function runs this side's kernels."""
        if self.kernels == "pytorch":
            return mmcv_cuda_switch.function_routed_to(mmcv_pytorch_sampler)
        if self.module is not None:
            return mmcv_cuda_switch.mmcv_cuda_msda(self.module)
        return nullcontext()

    def describe(self, device: torch.device) -> str:
        if device.type != "cuda" or self.kernels == "pytorch":
            return _MMCV_PYTORCH
        return _COMPILED if self.module is None else mmcv_cuda_build.describe(self.module)


MMCV_PYTORCH = MmcvSide()


def mmcv_side(choice: Optional[str], device: torch.device) -> MmcvSide:
    """The mmcv side for ``choice`` ('cuda', 'pytorch', or None: 'cuda' on a
    CUDA device where mmcv's kernels are here, compiled mmcv or msda_mm's
    build for this GPU, else 'pytorch').  Raises ValueError if 'cuda' cannot
    run on ``device``, mmcv_cuda_build.BuildError (saying how to build) if
    msda_mm's build is missing or cannot load."""
    if choice not in (None, *MMCV_KERNELS):
        raise ValueError(f"mmcv kernels must be one of {MMCV_KERNELS} or None, got {choice!r}")
    if choice == "pytorch" or (choice is None and device.type != "cuda"):
        return MMCV_PYTORCH
    if device.type != "cuda":
        raise ValueError(f"mmcv's CUDA kernels need a model on a CUDA device, not {device}")
    if not MMCV_LITE:
        return MmcvSide("cuda")
    if choice is None and mmcv_cuda_build.found_build() is None:
        return MMCV_PYTORCH
    return MmcvSide("cuda", mmcv_cuda_build.load_extension())


def describe(op: str, device: torch.device, mmcv: MmcvSide = MMCV_PYTORCH) -> str:
    """What ``op`` computes with on ``device`` (the mmcv side: ``mmcv``), for reports."""
    return _triton(device) if op == "triton" else mmcv.describe(device)


def as_configured(model: nn.Module, device: torch.device) -> dict[str, str]:
    """What each class of MSDA module in ``model`` computes with on
    ``device`` outside use_op, by class name, for reports."""
    kernels = mmcv_cuda_switch.active()
    if device.type != "cuda":
        mmcv = _MMCV_PYTORCH
    elif not MMCV_LITE:
        mmcv = _COMPILED
    elif kernels is not None:
        mmcv = mmcv_cuda_build.describe(kernels)
    else:
        mmcv = f"{_triton(device)} (mmcv-lite's route of mmcv's Function)"
    return {type(m).__name__: _triton(device) if isinstance(m, TritonMSDeformAttn) else mmcv
            for m in msda_modules(model).values()}


def msda_modules(model: nn.Module) -> dict[str, MultiScaleDeformableAttention]:
    """Every multi-scale deformable attention of ``model``, by module name."""
    return {name: m for name, m in model.named_modules()
            if isinstance(m, MultiScaleDeformableAttention)}


@contextmanager
def use_op(model: nn.Module, op: str, mmcv: MmcvSide = MMCV_PYTORCH) -> Iterator[None]:
    """Run every MSDA module of ``model`` with ``op`` ('triton' or 'mmcv',
    the latter on ``mmcv``'s kernels) inside the block.  With 'triton' a
    module without the TRITON_SETTINGS attributes (an mmcv one) gets them at
    their defaults; a TritonMSDeformAttn keeps its own.  The modules'
    classes and attributes and mmcv's routing are restored on exit."""
    if op not in _CLASSES:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    modules = msda_modules(model).values()
    if not modules:
        raise ValueError("the model has no MultiScaleDeformableAttention module to compare")
    classes = [type(m) for m in modules]
    added = [{k: v for k, v in TRITON_SETTINGS.items() if k not in vars(m)}
             if op == "triton" else {} for m in modules]
    for m, settings in zip(modules, added):
        m.__class__ = _CLASSES[op]
        for name, value in settings.items():
            setattr(m, name, value)
    try:
        with mmcv.route() if op == "mmcv" else nullcontext():
            yield
    finally:
        for m, cls, settings in zip(modules, classes, added):
            m.__class__ = cls
            for name in settings:
                delattr(m, name)


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
