"""The forward's launcher: output buffer, kernel and tile choice, grid,
device guard."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import runtime
from ..fast_launch import FastLaunch
from ..tiles import TUNED, Tiles
from . import kernels

# The kernels as this module launches them: through FastLaunch (repeat
# launches skip Triton's argument binding; see fast_launch.py).
msda_fwd_kernel = FastLaunch(kernels.msda_fwd_kernel)
msda_fwd_pairs_kernel = FastLaunch(kernels.msda_fwd_pairs_kernel)


class ForwardPlan(NamedTuple):
    """plan_forward's launch constants."""
    pairs: bool  # msda_fwd_pairs_kernel, else msda_fwd_kernel
    grid: tuple
    out_shape: tuple  # (B, Q, M * D)
    args: tuple  # Q, S, D and the strides of value, the locations, the weights and out
    meta: dict  # L, K, SOFTMAX, the tile (and ACC for msda_fwd_kernel)


def plan_forward(value, sampling_locations, attention_weights, softmax: bool = False,
                 tiles: Tiles = TUNED) -> ForwardPlan:
    """What launch_forward's launch takes from its inputs' shapes, strides,
    dtypes and value's alignment alone (op.py keeps it per call signature)."""
    B, S, M, D = value.shape
    _, Q, _, L, K, _ = sampling_locations.shape
    acc = runtime.acc_dtype(value, sampling_locations, attention_weights)
    meta = tiles.pairs_tile(value, B * Q * M, acc)
    # out is allocated (B, Q, M * D), read by the kernels as (B, Q, M, D): the
    # same memory, no view op.
    out_strides = runtime.contiguous_strides((B, Q, M, D))
    if meta is not None:
        # The pairs kernel takes no channel strides (they are 1): 3 strides
        # of value and out each, where msda_fwd_kernel takes all 4.
        pairs, strides = True, 3
    else:
        pairs, strides = False, 4
        meta = dict(tiles.tile("fwd", value, L * K, B * Q * M), ACC=acc)
    args = (Q, S, D, *value.stride()[:strides], *sampling_locations.stride(),
            *attention_weights.stride(), *out_strides[:strides])
    return ForwardPlan(pairs, runtime.grid(value, Q, meta["BLOCK_Q"]), (B, Q, M * D), args,
                       dict(L=L, K=K, SOFTMAX=softmax, **meta))


def run_forward(plan: ForwardPlan, value, spatial_shapes, sampling_locations,
                attention_weights) -> torch.Tensor:
    """launch_forward with its plan_forward made before."""
    out = value.new_empty(*plan.out_shape)
    kernel = msda_fwd_pairs_kernel if plan.pairs else msda_fwd_kernel
    with runtime.device_guard(value):
        kernel[plan.grid](value, spatial_shapes, sampling_locations, attention_weights, out,
                          *plan.args, **plan.meta)
    return out


def launch_forward(value, spatial_shapes, sampling_locations, attention_weights,
                   softmax: bool = False, tiles: Tiles = TUNED) -> torch.Tensor:
    """Non-empty inputs only (B * Q * M * D > 0).

    value (B, S, M, D); spatial_shapes (L, 2) int (the kernels derive each
    level's start from it); sampling_locations (B, Q, M, L, K, 2);
    attention_weights (B, Q, M, L, K), or with ``softmax`` logits whose softmax over the
    L * K points the kernel takes.  ``tiles``: the tile policy.  Returns
    (B, Q, M * D) in value's dtype."""
    plan = plan_forward(value, sampling_locations, attention_weights, softmax, tiles)
    return run_forward(plan, value, spatial_shapes, sampling_locations, attention_weights)
