"""Pure-PyTorch Multi-Scale Deformable Attention.

The semantics every other path in msda_mm is tested against, and the CPU
implementation models use.  Bilinear sampling with zero padding through
``F.grid_sample(align_corners=False)``, i.e. the pixel coordinate of a
normalised location ``x`` in a level of width ``W`` is ``x * W - 0.5``: the
same function as mmcv's ``multi_scale_deformable_attn_pytorch`` and its CUDA
kernel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .validate import check_level_values, level_starts


def level_start_index_from_shapes(spatial_shapes: torch.Tensor) -> torch.Tensor:
    """Offsets of each level in the flattened value sequence, computed on the
    shapes' own device (no host synchronisation).

    spatial_shapes: (L, 2) integer (H, W) per level.  Returns (L,) int64.
    """
    sizes = spatial_shapes[:, 0].long() * spatial_shapes[:, 1].long()
    return torch.cumsum(sizes, 0) - sizes


def point_softmax(attention_logits: torch.Tensor) -> torch.Tensor:
    """Softmax of (B, Q, M, L, K) attention logits over the L * K points of
    each (query, head), in at least fp32: what autocast makes of mmcv's
    ``attention_weights.softmax(-1)`` on 16-bit logits."""
    dtype = torch.promote_types(attention_logits.dtype, torch.float32)
    return torch.softmax(attention_logits.flatten(-2), -1, dtype=dtype).view(
        attention_logits.shape)


def _live_or_outside(loc: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Locations (..., 2) of one h x w level where the sample is live (pixel
    coordinate x * w - 0.5 in [-1, w), y's in [-1, h): the kernels'
    sampling.sample_cell), else -2, outside every level, whose gradient
    reaches the location times 0: a sample that is not live samples zero
    and its location's gradient is 0 x its upstream gradient (NaN where that
    is inf or NaN), as grid_sample makes them for any location outside,
    also where its own pixel coordinate would be NaN (a NaN location) or
    overflow (1e38 * w in fp32)."""
    x_im = loc[..., 0] * w - 0.5
    y_im = loc[..., 1] * h - 0.5
    live = (x_im >= -1.0) & (x_im < w) & (y_im >= -1.0) & (y_im < h)
    # nan_to_num's gradient is the incoming one times isfinite: 0 x inf stays NaN.
    outside = 0.0 * torch.nan_to_num(loc) - 2.0
    return torch.where(live[..., None], loc, outside)


def msda_reference(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    level_start_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """Multi-scale deformable attention in plain PyTorch.

    Args:
        value: (B, S, M, D), S = sum over levels of H_l * W_l.
        spatial_shapes: (L, 2) integer (H_l, W_l).
        sampling_locations: (B, Q, M, L, K, 2) normalised (x, y) in [0, 1].
        attention_weights: (B, Q, M, L, K).
        level_start_index: (L,) offsets of each level in S, or None to use the
            cumulative sizes of ``spatial_shapes``.

    A location outside its level (NaN, inf and huge ones included) samples
    zero; its gradient and its weight's are 0 times the gradients that
    reach them, NaN where those are inf or NaN (docs/determinism.md,
    "Non-finite values").

    Returns:
        (B, Q, M * D) in the promoted dtype of the three float inputs.
        Differentiable with respect to all float inputs.

    The level shapes are read on the host (grid_sample needs Python ints),
    so this path synchronises with CUDA tensors; it is the reference, not the
    fast path.  Having read them, it checks them (ValueError unless the
    levels are positive, tile S and agree with level_start_index), except
    under torch.compile, which traces the values as unknown integers.
    """
    dtype = torch.promote_types(
        torch.promote_types(value.dtype, sampling_locations.dtype), attention_weights.dtype)
    value = value.to(dtype)
    loc = sampling_locations.to(dtype)
    B, S, M, D = value.shape
    _, Q, _, L, K, _ = sampling_locations.shape
    shapes = spatial_shapes.tolist()
    starts = None if level_start_index is None else level_start_index.tolist()
    if not torch.compiler.is_compiling():  # while tracing the values are symbols
        check_level_values(shapes, starts, S)
    if starts is None:
        starts = level_starts(shapes)
    sampled = []
    for lvl, ((h, w), start) in enumerate(zip(shapes, starts)):
        # (B, h*w, M, D) -> (B*M, D, h, w)
        v = value[:, start:start + h * w].permute(0, 2, 3, 1).reshape(B * M, D, h, w)
        # (B, Q, M, K, 2) -> (B*M, Q, K, 2)
        g = (2 * _live_or_outside(loc[:, :, :, lvl], h, w) - 1).transpose(1, 2).reshape(
            B * M, Q, K, 2)
        sampled.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros",
                                     align_corners=False))  # (B*M, D, Q, K)
    # (B*M, D, Q, L, K) weighted by (B*M, 1, Q, L, K), summed over L and K.
    stacked = torch.stack(sampled, dim=3)
    weights = attention_weights.to(dtype).transpose(1, 2).reshape(B * M, 1, Q, L, K)
    out = (stacked * weights).sum(dim=(-2, -1))  # (B*M, D, Q)
    return out.view(B, M, D, Q).permute(0, 3, 1, 2).reshape(B, Q, M * D)
