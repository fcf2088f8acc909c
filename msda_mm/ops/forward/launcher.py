"""The forward's launcher: output buffer, kernel and tile choice, grid,
device guard."""
from __future__ import annotations

import torch

from .. import runtime
from ..fast_launch import FastLaunch
from ..tiles import TUNED, Tiles
from . import kernels

# The kernels as this module launches them: through FastLaunch (repeat
# launches skip Triton's argument binding; see fast_launch.py).
msda_fwd_kernel = FastLaunch(kernels.msda_fwd_kernel)
msda_fwd_pairs_kernel = FastLaunch(kernels.msda_fwd_pairs_kernel)


def launch_forward(value, spatial_shapes, sampling_locations, attention_weights,
                   softmax: bool = False, tiles: Tiles = TUNED) -> torch.Tensor:
    """Non-empty inputs only (B * Q * M * D > 0).

    value (B, S, M, D); spatial_shapes (L, 2) int (the kernels derive each
    level's start from it); sampling_locations (B, Q, M, L, K, 2);
    attention_weights (B, Q, M, L, K), or with ``softmax`` logits whose softmax over the
    L * K points the kernel takes.  ``tiles``: the tile policy.  Returns
    (B, Q, M * D) in value's dtype."""
    B, S, M, D = value.shape
    _, Q, _, L, K, _ = sampling_locations.shape
    out = value.new_empty(B, Q, M, D)
    acc = runtime.acc_dtype(value, sampling_locations, attention_weights)
    meta = tiles.pairs_tile(value, B * Q * M, acc)
    if meta is not None:
        # The pairs kernel takes no channel strides (they are 1): 3 strides
        # of value and out each, where msda_fwd_kernel takes all 4.
        kernel, strides = msda_fwd_pairs_kernel, 3
    else:
        kernel, strides = msda_fwd_kernel, 4
        meta = dict(tiles.tile("fwd", value, L * K, B * Q * M), ACC=acc)
    with runtime.device_guard(value):
        kernel[runtime.grid(value, Q, meta["BLOCK_Q"])](
            value, spatial_shapes, sampling_locations, attention_weights, out,
            Q, S, D,
            *value.stride()[:strides], *sampling_locations.stride(),
            *attention_weights.stride(), *out.stride()[:strides],
            L=L, K=K, SOFTMAX=softmax, **meta,
        )
    return out.view(B, Q, M * D)
