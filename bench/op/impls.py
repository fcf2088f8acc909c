"""The implementations a benchmark compares, each bound to one input set as
``f(value, sampling_locations, attention_weights) -> (B, Q, M*D)``.

'mmcv' and 'mmcv_cuda' are mmcv's MultiScaleDeformableAttnFunction as its
module calls it (locations and weights cast to value's dtype, so no bf16;
im2col_step 64) on mmcv's CUDA kernels: compiled mmcv's ('mmcv'), or on
mmcv-lite msda_mm's build of them from the mmcv sdist ('mmcv_cuda',
tools/build_mmcv_msda.py), which only runs inside ``routed(impl)``.

'deformops' (PyPI deformops) and 'msda_triton' (roulbac/msda-triton, the
Triton op msda_mm started from) are optional peer packages' ops
(bench/op/peers.py), where they are installed, with locations and weights
cast to value's dtype as for mmcv.
"""
from __future__ import annotations

import functools
import importlib.util
from contextlib import nullcontext
from types import ModuleType
from typing import Callable, ContextManager, Optional, Union

import torch

from msda_mm.ops import msda_reference, multi_scale_deformable_attention

from .inputs import MSDAInputs
from .peers import PEERS, peer_function, peer_unavailable

# msda_mm_det: msda_mm with deterministic=True (grad_value without atomics).
IMPLS = ("msda_mm", "msda_mm_det", "reference", "mmcv", "mmcv_cuda", *PEERS)
MSDA_MM = ("msda_mm", "msda_mm_det")
_MMCV_IMPLS = ("mmcv", "mmcv_cuda")

MSDAFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _compiled_mmcv() -> bool:
    """Whether mmcv's own compiled ops, its MSDA kernels among them, load here."""
    try:
        # mmcv-lite has no mmcv._ext, or msda_mm.compat's stub, which has no
        # loader (and routes the Function to msda_mm: no baseline).
        spec = importlib.util.find_spec("mmcv._ext")
        if spec is None or spec.loader is None:
            return False
        # An mmcv built for another torch raises OSError or ImportError here.
        import mmcv._ext as ext
    except (ImportError, OSError):
        return False
    return hasattr(ext, "ms_deform_attn_forward")


@functools.lru_cache(maxsize=None)
def mmcv_cuda_kernels() -> Union[ModuleType, str]:
    """msda_mm's build of mmcv's kernels for this GPU, or why there is none."""
    # Imported here: msda_mm.compat needs mmcv, which the other impls do not.
    from msda_mm.compat import MMCV_LITE, mmcv_cuda_build

    if not MMCV_LITE:
        return "mmcv is compiled: impl 'mmcv' runs its kernels"
    try:
        return mmcv_cuda_build.load_extension()
    except mmcv_cuda_build.BuildError as e:
        return str(e)


def tiled(impl: str) -> tuple[str, dict]:
    """``'msda_mm@16x4,32x8x8'`` -> ('msda_mm', tile_override kwargs): msda_mm
    with forward tile BLOCK_Q=16/4 warps (msda_fwd_kernel) and backward
    BLOCK_Q=32/8 warps/BLOCK_P=8 (points per chunk; default 16).  A forward
    written ``p8x1`` is msda_fwd_pairs_kernel's BLOCK_Q x warps instead
    (where the call can take it).  msda_mm_det takes tiles the same way."""
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
        raise ValueError(f"tile spec {spec!r}: expected FWD_BQxWARPS[xBLOCK_P] or "
                         "pFWD_BQxWARPS, BWD_BQxWARPS[xBLOCK_P]") from None
    return base, {kind: fwd, "bwd": bwd}


def unavailable(impl: str, device: torch.device, dtype: torch.dtype) -> Optional[str]:
    """Why ``impl`` cannot run on ``device`` with a ``dtype`` value, or None."""
    if impl in PEERS:
        return peer_unavailable(PEERS[impl], device)
    if impl not in _MMCV_IMPLS:
        return None
    if device.type != "cuda":
        return "mmcv's op is CUDA only"
    if dtype == torch.bfloat16:
        return "mmcv has no bf16 kernels"
    if impl == "mmcv" and not _compiled_mmcv():
        return "no compiled mmcv (mmcv._ext with ms_deform_attn_forward)"
    if impl == "mmcv_cuda" and isinstance(mmcv_cuda_kernels(), str):
        return mmcv_cuda_kernels()
    return None


def routed(impl: str) -> ContextManager:
    """What ``impl``'s calls need around them: for 'mmcv_cuda', mmcv's
    Function on msda_mm's build of mmcv's kernels (mmcv-lite routes it to
    msda_mm's op otherwise)."""
    if impl != "mmcv_cuda":
        return nullcontext()
    from msda_mm.compat import mmcv_cuda_switch

    return mmcv_cuda_switch.mmcv_cuda_msda(mmcv_cuda_kernels())


def bind(impl: str, inputs: MSDAInputs, fp32_grad_accum: Optional[bool] = None) -> MSDAFn:
    """``impl`` with the level shapes of ``inputs`` fixed; fp32_grad_accum only
    applies to msda_mm (None: its automatic choice)."""
    shapes, starts = inputs.spatial_shapes, inputs.level_start_index
    if impl in MSDA_MM:
        deterministic = True if impl == "msda_mm_det" else None
        return lambda v, loc, attn: multi_scale_deformable_attention(
            v, shapes, starts, loc, attn, fp32_grad_accum=fp32_grad_accum,
            deterministic=deterministic)
    if impl == "reference":
        # Host copies of the shapes: the reference reads them as Python ints,
        # which on CUDA tensors would synchronise on every call and make the
        # call impossible to capture in a CUDA graph.
        shapes_host, starts_host = shapes.cpu(), starts.cpu()
        return lambda v, loc, attn: msda_reference(
            v, shapes_host, loc, attn, starts_host).to(v.dtype)
    if impl in _MMCV_IMPLS:
        from msda_mm.compat.mmcv_cuda_switch import mmcv_function

        return lambda v, loc, attn: mmcv_function(v, shapes, starts, loc, attn)
    if impl in PEERS:
        msda = peer_function(PEERS[impl])
        return lambda v, loc, attn: msda(v, shapes, starts, loc.to(v.dtype), attn.to(v.dtype))
    raise ValueError(f"unknown implementation {impl!r}, expected one of {IMPLS}")
