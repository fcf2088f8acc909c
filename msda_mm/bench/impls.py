"""The implementations a benchmark compares, each bound to one input set as
``f(value, sampling_locations, attention_weights) -> (B, Q, M*D)``."""
from __future__ import annotations

import importlib.util
from typing import Callable, Optional

import torch

from msda_mm.ops import msda_reference, multi_scale_deformable_attention

from .inputs import MSDAInputs

IMPLS = ("msda_mm", "reference", "mmcv")

MSDAFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# mmcv's CUDA kernels take im2col_step = min(B, this) (mmdet's default 64).
_MMCV_IM2COL_STEP = 64


def _mmcv_function():
    """mmcv's CUDA autograd Function, or None without a compiled mmcv."""
    try:
        # mmcv-lite has no mmcv._ext, or msda_mm.compat's stub, which has no
        # loader (and routes the Function to msda_mm: no baseline).
        spec = importlib.util.find_spec("mmcv._ext")
        if spec is None or spec.loader is None:
            return None
        # An mmcv built for another torch raises OSError or ImportError here.
        import mmcv._ext as ext
        from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction
    except (ImportError, OSError):
        return None
    return MultiScaleDeformableAttnFunction if hasattr(ext, "ms_deform_attn_forward") else None


def tiled(impl: str) -> tuple[str, dict]:
    """``'msda_mm@16x4,32x8x8'`` -> ('msda_mm', tile_override kwargs): msda_mm
    with forward tile BLOCK_Q=16/4 warps (msda_fwd_kernel) and backward
    BLOCK_Q=32/8 warps/BLOCK_P=8 (points per chunk; default 16).  A forward
    written ``p8x1`` is msda_fwd_pairs_kernel's BLOCK_Q x warps instead
    (where the call can take it)."""
    base, _, spec = impl.partition("@")
    if not spec:
        return base, {}
    try:
        fwd, bwd = spec.split(",")
        kind = "pairs" if fwd.startswith("p") else "fwd"
        fwd, bwd = (tuple(int(n) for n in part.split("x")) for part in (fwd.lstrip("p"), bwd))
        if kind == "pairs" and len(fwd) != 2:
            raise ValueError
    except ValueError:
        raise ValueError(f"tile spec {spec!r}: expected "
                         "FWD_BQxWARPS[xBLOCK_P] or pFWD_BQxWARPS, BWD_BQxWARPS[xBLOCK_P]") from None
    return base, {kind: fwd, "bwd": bwd}


def unavailable(impl: str, device: torch.device, dtype: torch.dtype) -> Optional[str]:
    """Why ``impl`` cannot run on ``device`` with a ``dtype`` value, or None."""
    if impl != "mmcv":
        return None
    if device.type != "cuda":
        return "mmcv's op is CUDA only"
    if dtype == torch.bfloat16:
        return "mmcv has no bf16 kernels"
    if _mmcv_function() is None:
        return "no compiled mmcv (mmcv._ext with ms_deform_attn_forward)"
    return None


def bind(impl: str, inputs: MSDAInputs, fp32_grad_accum: Optional[bool] = None) -> MSDAFn:
    """``impl`` with the level shapes of ``inputs`` fixed; fp32_grad_accum only
    applies to msda_mm (None: its automatic choice)."""
    shapes, starts = inputs.spatial_shapes, inputs.level_start_index
    if impl == "msda_mm":
        return lambda v, loc, attn: multi_scale_deformable_attention(
            v, shapes, starts, loc, attn, fp32_grad_accum=fp32_grad_accum)
    if impl == "reference":
        # Host copies of the shapes: the reference reads them as Python ints,
        # which on CUDA tensors would synchronise on every call and make the
        # call impossible to capture in a CUDA graph.
        shapes_host, starts_host = shapes.cpu(), starts.cpu()
        return lambda v, loc, attn: msda_reference(
            v, shapes_host, loc, attn, starts_host).to(v.dtype)
    if impl == "mmcv":
        fn = _mmcv_function()
        return lambda v, loc, attn: fn.apply(v, shapes, starts, loc, attn, _MMCV_IM2COL_STEP)
    raise ValueError(f"unknown implementation {impl!r}, expected one of {IMPLS}")
