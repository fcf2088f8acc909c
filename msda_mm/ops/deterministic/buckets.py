"""The deterministic backward's samples in their buckets, from what
msda_bwd_kernel filled (buffers.py): the stable sort (torch.sort, then
sorted_fill_kernel) or the counting sort (a cumsum, then
bucket_fill_kernel, and the heads' bounds for its fixed point)."""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton.language as tl

from .. import runtime
from ..fast_launch import FastLaunch
from . import bound, bucket_fill, sorted_fill
from .buffers import CountingBuffers, KeyBuffers, sort_sizes
from .records import record_dtype

# The kernels as this module launches them (fast_launch.py).
grad_value_bound_kernel = FastLaunch(bound.grad_value_bound_kernel)
bucket_fill_kernel = FastLaunch(bucket_fill.bucket_fill_kernel)
sorted_fill_kernel = FastLaunch(sorted_fill.sorted_fill_kernel)

# grad_value_bound_kernel's tile: 2048 grad_output elements a 4-warp program (16 a thread).
_BOUND = dict(ELEMENTS=2048, num_warps=4)
# bucket_fill_kernel's and sorted_fill_kernel's tile: 128 samples a 4-warp program, one a
# thread.
_SORT = dict(SAMPLES=128, num_warps=4)


def grad_value_bound(go: torch.Tensor, attention_weights: torch.Tensor,
                     query_max: torch.Tensor | None = None) -> torch.Tensor:
    """(B, M) float64: a bound on |every partial sum| of grad_value[b, :, m, :]
    for grad_output ``go`` (B, Q, M, D), computed on the device (no sync) by
    bound.py.

    Each sample adds its weight times grad_output's row to four corners with
    bilinear weights summing to 1, so a query adds at most
    max_d |go[b, q, m, d]| * sum_{l,k} |w[b, q, m, l, k]| to any element; Q
    times the largest of those bounds every sum.  A max rather than the sum
    over the queries (looser by the largest query's bound over the mean one,
    about 2x for random grad_output), so that the bound is the same whatever
    the queries' order.  inf or NaN in go or the weights make it inf or NaN:
    the gather then sums the head's inf and NaN terms apart
    (fixed_point.head_finite).  ``query_max``, a (B, Q, M) tensor (fp32;
    fp64 for fp64 ``go``): also each query's max over its finite
    |go[b, q, m, d]|, from which the gather takes each value row's exponent."""
    B, Q, M, D = go.shape
    _, _, _, L, K = attention_weights.shape
    head_bounds = torch.zeros(B, M, device=go.device, dtype=torch.float64)
    block_d = runtime.next_pow2(D)
    block_q = max(1, _BOUND["ELEMENTS"] // block_d)
    wide = [tl.float64 if t.dtype == torch.float64 else tl.float32
            for t in (go, attention_weights)]
    with runtime.device_guard(go):
        grad_value_bound_kernel[runtime.grid(go, Q, block_q)](
            go, attention_weights, head_bounds.view(torch.int64), query_max, Q, D, *go.stride(),
            *attention_weights.stride(), L=L, K=K, BLOCK_Q=block_q,
            BLOCK_P=min(runtime.next_pow2(L * K), _BOUND["ELEMENTS"] // block_q),
            BLOCK_D=block_d, MAX_TY=wide[0], SUM_TY=wide[1], num_warps=_BOUND["num_warps"])
    return head_bounds


def stable_records(value, sampling_locations, keyed: KeyBuffers):
    """The samples bucketed by cell by a stable sort of msda_bwd_kernel's
    keys (sorted_fill.py): (bounds, records), bucket (head, cell)
    holding records bounds[0, i] .. bounds[1, i], i = cell * B * M + head, its
    entries in sample order, the same every run."""
    B, Q, M, L, K, _ = sampling_locations.shape
    cells, samples, _, index = sort_sizes(value, sampling_locations)
    with runtime.device_guard(value):
        sorted_keys, perm = torch.sort(keyed.keys, stable=True)
        bounds = torch.zeros(2, cells * B * M, device=value.device, dtype=index)
        records = torch.empty_like(keyed.records)
        sorted_fill_kernel[(-(-samples // _SORT["SAMPLES"]),)](
            sorted_keys, perm, keyed.records, records, bounds, samples, cells, B * M, Q * L * K,
            keyed.bias, BLOCK=_SORT["SAMPLES"], num_warps=_SORT["num_warps"])
    return bounds, records


def _fill_tile(L: int, K: int, acc_dtype) -> dict:
    """bucket_fill_kernel's launch constants."""
    block_p = min(runtime.next_pow2(L * K), _SORT["SAMPLES"])
    return dict(BLOCK_Q=_SORT["SAMPLES"] // block_p, BLOCK_P=block_p, ACC=acc_dtype,
                num_warps=_SORT["num_warps"])


def counting_records(value, spatial_shapes, sampling_locations, attention_weights,
                     counted: CountingBuffers, acc_dtype):
    """The samples counting-sorted by cell from msda_bwd_kernel's ranks:
    (offsets, records), where bucket i holds entries offsets[i]:offsets[i + 1]
    in an order that varies run to run; entry j's record records[j]
    (records.py: int32 words for fp32 acc_dtype, int64 for fp64) holds its
    query and the bits of its attention weight and bilinear fractions lx,
    ly (acc_dtype)."""
    _, Q, _, L, K, _ = sampling_locations.shape
    records = torch.empty(counted.ranks.numel(), 4, device=value.device,
                          dtype=record_dtype(acc_dtype))
    fill = _fill_tile(L, K, acc_dtype)
    offsets = counted.counts
    with runtime.device_guard(value):
        # Exclusive starts: counts[0] stays 0, bucket i's count was at i + 1.
        offsets.cumsum_(0)
        bucket_fill_kernel[runtime.grid(value, Q, fill["BLOCK_Q"])](
            spatial_shapes, sampling_locations, attention_weights, counted.ranks, offsets,
            records, Q, counted.cells, *sampling_locations.stride(),
            *attention_weights.stride(), L=L, K=K, **fill)
    return offsets, records


class Buckets(NamedTuple):
    """The samples bucketed by cell for grad_value_gather_kernel: bucket i
    = head * strides[0] + cell * strides[1] holds records lo[i] .. hi[i];
    with the counting sort (fixed point) also the heads' bounds and the
    queries' max |grad_output| (None with the stable sort)."""
    cells: int
    lo: torch.Tensor
    hi: torch.Tensor
    strides: tuple[int, int]
    records: torch.Tensor
    bound: torch.Tensor | None
    query_max: torch.Tensor | None


def bucket_samples(go, value, spatial_shapes, sampling_locations, attention_weights,
                   buffers: CountingBuffers | KeyBuffers, acc_dtype) -> Buckets:
    """The samples that msda_bwd_kernel ranked (CountingBuffers: the counting
    sort) or keyed (KeyBuffers: the stable sort) in their buckets."""
    if isinstance(buffers, KeyBuffers):
        bounds, records = stable_records(value, sampling_locations, buffers)
        B, _, M, _ = value.shape
        return Buckets(buffers.cells, bounds[0], bounds[1], (1, B * M), records, None, None)
    B, Q, M = attention_weights.shape[:3]
    query_max = torch.empty(B, Q, M, device=value.device, dtype=torch.float64
                            if go.dtype == torch.float64 else torch.float32)
    head_bounds = grad_value_bound(go, attention_weights, query_max)
    offsets, records = counting_records(value, spatial_shapes, sampling_locations,
                                        attention_weights, buffers, acc_dtype)
    return Buckets(buffers.cells, offsets, offsets[1:], (buffers.cells, 1), records, head_bounds,
                   query_max)
