"""Allocating wrappers around the Triton kernels: output buffers, tile
choice, grid, device guard.  Inputs are assumed validated (validate.py)."""
from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

from .kernels import msda_bwd_kernel, msda_fwd_kernel


def interpreter_enabled() -> bool:
    """True when Triton runs kernels on the CPU (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# (BLOCK_Q, num_warps) per kernel; tools/benchmark.py --tiles measures others.
# One program covers BLOCK_Q queries x the whole (padded) head dim.  16 x 4
# warps was the best fp32 decoder forward of 10 shapes tried on the H200
# (16.5 us; 8x1 20.6, 32x4 19.5, 64x8 20.7) and within 1% of the best backward
# (unrolled-K kernel, warm replays; benchmarks/NOTES.md).  16-bit dtypes were
# not swept yet: NOTES.md says why 32x4 or 16x2 should suit them better.
_TILES = {"fwd": (16, 4), "bwd": (16, 4)}
_tile_override: dict = {}


@contextlib.contextmanager
def tile_override(fwd: tuple[int, int] | None = None, bwd: tuple[int, int] | None = None):
    """Launch with other (BLOCK_Q, num_warps) tiles inside this block: a
    tuning hook for the benchmark, not an API for models."""
    saved = dict(_tile_override)
    _tile_override.update({k: v for k, v in (("fwd", fwd), ("bwd", bwd)) if v is not None})
    try:
        yield
    finally:
        _tile_override.clear()
        _tile_override.update(saved)


def _tile(kernel: str, D: int) -> dict:
    block_q, num_warps = _tile_override.get(kernel, _TILES[kernel])
    return dict(BLOCK_Q=block_q, BLOCK_D=triton.next_power_of_2(D), num_warps=num_warps)


def _acc_dtype(*tensors: torch.Tensor):
    # fp32 registers for fp32/fp16/bf16; fp64 only when asked for (gradcheck).
    return tl.float64 if any(t.dtype == torch.float64 for t in tensors) else tl.float32


def _device_guard(t: torch.Tensor):
    # Launch on the tensors' device, not the current one (cuda:1 inputs
    # while cuda:0 is current must work).
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _grid(B: int, Q: int, M: int, block_q: int):
    return (triton.cdiv(Q, block_q) * B * M,)


def msda_forward(value, spatial_shapes, level_start_index, sampling_locations,
                 attention_weights) -> torch.Tensor:
    """Non-empty inputs only (B * Q * M * D > 0).

    value (B, S, M, D); spatial_shapes (L, 2) int; level_start_index (L,)
    int; sampling_locations (B, Q, M, L, K, 2); attention_weights
    (B, Q, M, L, K).  Returns (B, Q, M * D) in value's dtype."""
    B, S, M, D = value.shape
    _, Q, _, L, K, _ = sampling_locations.shape
    out = value.new_empty(B, Q, M, D)
    tile = _tile("fwd", D)
    with _device_guard(value):
        msda_fwd_kernel[_grid(B, Q, M, tile["BLOCK_Q"])](
            value, spatial_shapes, level_start_index, sampling_locations, attention_weights, out,
            Q, M, S, D,
            *value.stride(), *sampling_locations.stride(), *attention_weights.stride(),
            *out.stride(),
            L=L, K=K, ACC=_acc_dtype(value, sampling_locations, attention_weights), **tile,
        )
    return out.view(B, Q, M * D)


def msda_backward(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                  attention_weights, fp32_grad_accum: bool):
    """Non-empty inputs only.  grad_output (B, Q, M * D).  Returns (grad_value, grad_loc, grad_attn),
    each contiguous in its input's dtype and shape.

    fp32_grad_accum: accumulate grad_value in an fp32 scratch buffer and
    round once at the end instead of atomically adding in value's dtype.
    """
    B, S, M, D = value.shape
    _, Q, _, L, K, _ = sampling_locations.shape
    grad_loc = sampling_locations.new_empty(sampling_locations.shape)
    grad_attn = attention_weights.new_empty(attention_weights.shape)
    accum_dtype = torch.float32 if fp32_grad_accum else value.dtype
    grad_value = torch.zeros(value.shape, dtype=accum_dtype, device=value.device)
    go = grad_output.unflatten(-1, (M, D))  # a view for any strides
    tile = _tile("bwd", D)
    with _device_guard(value):
        msda_bwd_kernel[_grid(B, Q, M, tile["BLOCK_Q"])](
            go, value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
            grad_value, grad_loc, grad_attn,
            Q, M, S, D,
            *go.stride(), *value.stride(), *sampling_locations.stride(),
            *attention_weights.stride(),
            *grad_value.stride()[:3], *grad_loc.stride(), *grad_attn.stride(),
            L=L, K=K, ACC=_acc_dtype(value, sampling_locations, attention_weights), **tile,
        )
    return grad_value.to(value.dtype), grad_loc, grad_attn
