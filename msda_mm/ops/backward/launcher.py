"""The backward's launcher: a plan made from the forward's inputs alone
(tile, grid, dtypes, strides), then the buffers, grad_value's fill,
msda_bwd_kernel and, for the deterministic backward, the sort and the
gather (deterministic/)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import runtime
from ..deterministic.buckets import bucket_samples
from ..deterministic.buffers import kernel_args, sort_buffers
from ..deterministic.grad_value import gather_grad_value
from ..fast_launch import FastLaunch
from ..tiles import TUNED, Tiles
from . import kernels
from .zero_fill import fill_zeros

# The kernel as this module launches it (fast_launch.py).
msda_bwd_kernel = FastLaunch(kernels.msda_bwd_kernel)


class BackwardPlan(NamedTuple):
    """plan_backward's launch constants."""
    grid: tuple
    meta: dict  # msda_bwd_kernel's tile, L, K, ACC, SOFTMAX
    accum: torch.dtype | None  # grad_value's atomics dtype; None: deterministic
    sort: str | None  # the deterministic backward's sort (Tiles.deterministic_sort)
    gather: dict | None  # the deterministic backward's grad_value_gather_kernel tile
    g_dtype: torch.dtype  # the weights' gradient as the kernel stores it
    strides: tuple  # value's, the locations' and the weights'
    # What run_backward allocates, contiguous: grad_value's (B, S, M) strides (0s without
    # it), grad_loc's and the weights' gradient's.
    grad_strides: tuple
    sizes: tuple  # Q, S, D
    heads: int  # M


def plan_backward(value, sampling_locations, attention_weights, fp32_grad_accum: bool,
                  deterministic: bool = False, softmax: bool = False,
                  tiles: Tiles = TUNED) -> BackwardPlan:
    """What launch_backward's launches take from the forward's inputs alone:
    the tiles (of ``tiles``, the policy), grid, sort, accumulator dtypes and
    those inputs' strides.  Made on the forward's thread, it takes that
    Python off autograd's device thread, where the backward's Python runs
    about 2x slower than on the calling thread (docs/design.md)."""
    if softmax and deterministic:
        raise ValueError("msda_backward: softmax=True takes the float-atomic backward only, "
                         "got deterministic=True (run it on point_softmax(logits) instead)")
    B, S, M, D = value.shape
    _, Q, _, L, K, _ = sampling_locations.shape
    acc = runtime.acc_dtype(value, sampling_locations, attention_weights)
    # Without grad_value a tile of its own up to D = 64; past it the fp32 float backward's
    # (8 points a chunk): the 16-bit one spilled at D = 256 (research/compile_check.py).
    if deterministic and D <= 64:
        tile = tiles.tile("bwd_det", value, L * K, B * Q * M)
    else:
        tile = tiles.tile("bwd", value, L * K, B * Q * M, 4 if deterministic else 0)
    # The kernel stores the weights' gradient g in g_attn; with softmax, the
    # logits' p * (g - sum(p * g)) in grad_attn after it.  g in point_softmax's
    # dtype (fp32 at least), as the unfused backward had it: 16-bit g would
    # round (2**-9 for bf16) before that subtraction cancels.
    g_dtype = (torch.promote_types(attention_weights.dtype, torch.float32) if softmax
               else attention_weights.dtype)
    accum = None if deterministic else (torch.float32 if fp32_grad_accum else value.dtype)
    sort = gather = None
    if deterministic:
        sort = tiles.deterministic_sort(value, Q * L * K)
        # A bucket holds at most a head's Q * L * K samples: BLOCK_E needs no more.
        gather = tiles.tile("gather", value, Q * L * K, B * S * M)
    strides = (*value.stride(), *sampling_locations.stride(), *attention_weights.stride())
    grad_strides = ((0, 0, 0) if deterministic else runtime.contiguous_strides(value.shape)[:3])
    grad_strides += (*runtime.contiguous_strides(sampling_locations.shape),
                     *runtime.contiguous_strides(attention_weights.shape))
    return BackwardPlan(runtime.grid(value, Q, tile["BLOCK_Q"]),
                        dict(tile, L=L, K=K, ACC=acc, SOFTMAX=softmax), accum, sort, gather,
                        g_dtype, strides, grad_strides, (Q, S, D), M)


def run_backward(plan: BackwardPlan, grad_output, value, spatial_shapes, sampling_locations,
                 attention_weights):
    """launch_backward with its plan_backward made before."""
    launch_grid, meta, accum, sort, gather, g_dtype, strides, grad_strides, sizes, M = plan
    # empty_like: one aten op (torch.empty with a shape costs twice its host time);
    # contiguous whatever the input's layout.
    grad_loc = torch.empty_like(sampling_locations, memory_format=torch.contiguous_format)
    grad_attn = torch.empty_like(attention_weights, memory_format=torch.contiguous_format)
    g_attn, grad_logit = grad_attn, None
    if meta["SOFTMAX"]:
        grad_logit = grad_attn
        if g_dtype != grad_attn.dtype:
            g_attn = torch.empty_like(grad_attn, dtype=g_dtype)
    # grad_output (B, Q, M * D) read as (B, Q, M, D) by its strides: no view op.
    gob, goq, goc = grad_output.stride()
    grad_value, pdl = None, False
    buffers = sort_buffers(sort, value, sampling_locations, meta["ACC"])
    if accum is not None:
        grad_value = torch.empty_like(value, dtype=accum, memory_format=torch.contiguous_format)
        # The fill must be the kernel right before the backward: with PDL the
        # backward starts while the fill runs, and only its atomics wait for it.
        # (This assumes no other thread queues work on the same stream in
        # between, which PyTorch's stream semantics leave to the caller anyway.)
        pdl = fill_zeros(grad_value)
    with runtime.device_guard(value):
        msda_bwd_kernel[launch_grid](
            grad_output, value, spatial_shapes, sampling_locations, attention_weights,
            grad_value, grad_loc, g_attn, grad_logit, *kernel_args(buffers),
            *sizes, gob, goq, sizes[2] * goc, goc, *strides, *grad_strides,
            PDL=pdl, launch_pdl=pdl, **meta,
        )
    if accum is None:
        go = grad_output.unflatten(-1, (M, sizes[2]))
        buckets = bucket_samples(go, value, spatial_shapes, sampling_locations,
                                 attention_weights, buffers, meta["ACC"])
        del buffers  # the stable sort's keys and records in sample order: freed before the gather
        grad_value = gather_grad_value(go, value, spatial_shapes, buckets, sizes[0], meta["ACC"],
                                       gather)
    elif accum != value.dtype:
        grad_value = grad_value.to(value.dtype)
    return grad_value, grad_loc, grad_attn


def launch_backward(grad_output, value, spatial_shapes, sampling_locations, attention_weights,
                    fp32_grad_accum: bool, deterministic: bool = False,
                    softmax: bool = False, tiles: Tiles = TUNED):
    """Non-empty inputs only.  grad_output (B, Q, M * D).  Returns (grad_value,
    grad_loc, grad_attn), each contiguous in its input's dtype and shape.

    fp32_grad_accum: accumulate grad_value in an fp32 scratch buffer and
    round once at the end instead of atomically adding in value's dtype.
    deterministic: gather grad_value per value row without atomics instead,
    from the samples sorted by cell (Tiles.deterministic_sort: a stable sort
    and float sums in sample order, or a counting sort and integer sums at
    each row's own exponent; fp32_grad_accum is then unused): bitwise the
    same every run (see deterministic/ and docs/determinism.md).
    softmax: attention_weights are logits (launch_forward's ``softmax``) and
    grad_attn is their gradient, taken in the same kernel; not with
    ``deterministic``, whose grad_value takes the weights themselves (op.py
    runs that backward on point_softmax's weights).
    tiles: the tile policy.
    """
    plan = plan_backward(value, sampling_locations, attention_weights, fp32_grad_accum,
                         deterministic, softmax, tiles)
    return run_backward(plan, grad_output, value, spatial_shapes, sampling_locations,
                        attention_weights)
