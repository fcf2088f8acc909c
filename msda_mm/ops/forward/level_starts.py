"""level_start_index derived from spatial_shapes on the device in one launch.

The eager Triton path never reads a passed level_start_index (its values
cannot be checked against spatial_shapes without a host synchronisation):
it derives the starts from the shapes.  One Triton kernel does that where
``level_start_index_from_shapes`` takes three aten ops (product, cumsum,
subtraction), each a kernel launch of host time on the hot path; and a
model passes one spatial_shapes tensor to all its layers, so the starts of
the last one are kept for the next call (a DINO step: 1 launch, not 12).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..fast_launch import FastLaunch
from ..runtime import device_guard, next_pow2


@triton.jit
def level_starts_kernel(shapes_ptr, starts_ptr, L: tl.constexpr, BLOCK_L: tl.constexpr):
    """starts[l] = sum of H_j * W_j over the levels j < l (int64), from the
    contiguous (L, 2) int shapes."""
    lvl = tl.arange(0, BLOCK_L)
    live = lvl < L
    h = tl.load(shapes_ptr + 2 * lvl, mask=live, other=0).to(tl.int64)
    w = tl.load(shapes_ptr + 2 * lvl + 1, mask=live, other=0).to(tl.int64)
    sizes = h * w
    tl.store(starts_ptr + lvl, tl.cumsum(sizes, 0) - sizes, mask=live)


_kernel = FastLaunch(level_starts_kernel)


# (spatial_shapes, its version counter, the stream, starts) of the last call.
_last: tuple = (None, -1, None, None)


def _stream(t: torch.Tensor):
    return torch._C._cuda_getCurrentRawStream(t.device.index) if t.is_cuda else None


def level_starts_on_device(spatial_shapes: torch.Tensor) -> torch.Tensor:
    """(L,) int64 level starts of the contiguous (L, 2) int ``spatial_shapes``,
    computed on its device without a host synchronisation (CUDA tensors, or
    CPU tensors under ``TRITON_INTERPRET=1``).

    The same tensor object again, unmodified (its version counter) and on
    the same stream, gets the last call's starts (never to be written to).
    Not while a CUDA graph is captured (the graph must own what it reads),
    nor for inference tensors (which have no version counter)."""
    global _last
    uncached = spatial_shapes.is_inference() or (
        spatial_shapes.is_cuda and torch.cuda.is_current_stream_capturing())
    shapes, version, stream, starts = _last
    if (not uncached and shapes is spatial_shapes and version == spatial_shapes._version
            and stream == _stream(spatial_shapes)):
        return starts
    starts = _launch(spatial_shapes)
    if not uncached:
        _last = (spatial_shapes, spatial_shapes._version, _stream(spatial_shapes), starts)
    return starts


def _launch(spatial_shapes: torch.Tensor) -> torch.Tensor:
    L = spatial_shapes.shape[0]
    starts = torch.empty(L, dtype=torch.int64, device=spatial_shapes.device)
    with device_guard(spatial_shapes):
        _kernel[(1,)](spatial_shapes, starts, L=L, BLOCK_L=next_pow2(L), num_warps=1)
    return starts
