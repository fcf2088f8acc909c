"""The deterministic backward's grad_value: grad_value_gather_kernel's launch
over the bucketed samples (buckets.py)."""
from __future__ import annotations

import torch
import triton.language as tl

from .. import runtime
from ..fast_launch import FastLaunch
from . import gather
from .buckets import Buckets

# The kernel as this module launches it (fast_launch.py).
grad_value_gather_kernel = FastLaunch(gather.grad_value_gather_kernel)


def gather_grad_value(go, value, spatial_shapes, buckets: Buckets, Q: int, acc_dtype,
                      tile: dict) -> torch.Tensor:
    """grad_value in value's dtype, without atomics, gathered per value row
    from the bucketed samples of Q queries (gather.py; ``tile`` the gather's,
    Tiles.tile("gather", ...)).  With the counting sort summed as integers
    at the row's own exponent (fixed_point.py: int64; 16-bit values int32
    from terms rounded in fp32, exact_sums.py); with the stable sort summed
    in float in sample order."""
    B, S, M, D = value.shape
    fixed = buckets.bound is not None
    grad_value = torch.empty(value.shape, device=value.device, dtype=value.dtype)
    with runtime.device_guard(value):
        grad_value_gather_kernel[runtime.grid(value, S, tile["BLOCK_Q"])](
            go, spatial_shapes, buckets.bound, buckets.query_max, buckets.lo,
            buckets.hi, buckets.records, grad_value, Q, S, buckets.cells, *buckets.strides, D,
            *go.stride(), *grad_value.stride()[:3],
            L=spatial_shapes.shape[0], BLOCK_S=tile["BLOCK_Q"], BLOCK_E=tile["BLOCK_P"],
            BLOCK_D=tile["BLOCK_D"], ACC=acc_dtype, FIXED=fixed,
            FP32_TERMS=value.element_size() == 2 and acc_dtype is tl.float32,
            PAIRS=(not fixed and acc_dtype is tl.float32 and go.dtype == value.dtype
                   and runtime.half_words(go) and runtime.half_words(grad_value)
                   and Q * go.stride(1) < 2**31),
            num_warps=tile["num_warps"])
    return grad_value
