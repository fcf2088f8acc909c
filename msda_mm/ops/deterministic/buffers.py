"""What msda_bwd_kernel fills for the deterministic backward's sort: the
counting sort's counts and ranks, or the stable sort's keys and records."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .records import record_dtype


def cells_bound(S: int, L: int) -> int:
    """Cells of a head's extended grids, sum_l (H_l+1) * (W_l+1), bounded
    without reading the shapes (a host sync on CUDA): (H-1) * (W-1) >= 0
    gives H + W + 1 <= H * W + 2, so the sum is at most 2 * S + 2 * L."""
    return 2 * S + 2 * L


def sort_sizes(value, sampling_locations) -> tuple[int, int, int, torch.dtype]:
    """cells a head, samples, buckets + 1, and the index dtype of both sorts'
    counts, offsets, ranks and keys: int32 where all fit."""
    B, S, M, _ = value.shape
    _, Q, _, L, K, _ = sampling_locations.shape
    cells = cells_bound(S, L)
    samples, buckets = B * M * Q * L * K, B * M * cells + 1
    return cells, samples, buckets, (torch.int32 if max(samples, buckets) < 2**31
                                     else torch.int64)


class CountingBuffers(NamedTuple):
    """The counting sort's buffers (bucket_fill.py), msda_bwd_kernel's
    to fill: bucket (b * M + m) * cells + c counts its samples at
    counts[1 + i] (zeros first), each sample's rank in its bucket goes to
    ranks."""
    cells: int
    counts: torch.Tensor  # (B * M * cells + 1,), of ranks' dtype
    ranks: torch.Tensor  # (B * M * Q * L*K,)


def counting_buffers(value, sampling_locations) -> CountingBuffers:
    """Zeroed counts and the ranks for the samples of these locations."""
    cells, samples, buckets, index = sort_sizes(value, sampling_locations)
    return CountingBuffers(cells, torch.zeros(buckets, device=value.device, dtype=index),
                           torch.empty(samples, device=value.device, dtype=index))


def key_dtype(cells: int) -> tuple[torch.dtype, int]:
    """The stable sort's keys, a cell in [0, cells] plus a bias: int16 where
    cells + 1 keys fit (the radix sort makes two passes, not four:
    docs/design.md), else int32."""
    return (torch.int16, -2**15) if cells < 2**16 else (torch.int32, 0)


class KeyBuffers(NamedTuple):
    """The stable sort's input (sorted_fill.py), msda_bwd_kernel's to
    fill: each sample's key (its cell in its head plus ``bias``) and its
    record (records.py), both at its slot."""
    cells: int
    bias: int
    keys: torch.Tensor  # (B * M * Q * L*K,)
    records: torch.Tensor  # (B * M * Q * L*K, 4)


def key_buffers(value, sampling_locations, acc_dtype) -> KeyBuffers:
    """The keys and records for the samples of these locations."""
    cells, samples, _, _ = sort_sizes(value, sampling_locations)
    dtype, bias = key_dtype(cells)
    return KeyBuffers(cells, bias, torch.empty(samples, device=value.device, dtype=dtype),
                      torch.empty(samples, 4, device=value.device, dtype=record_dtype(acc_dtype)))


def sort_buffers(sort: str | None, value, sampling_locations,
                 acc_dtype) -> CountingBuffers | KeyBuffers | None:
    """What msda_bwd_kernel fills for ``sort`` (Tiles.deterministic_sort;
    None: the float-atomic backward, nothing)."""
    if sort == "counting":
        return counting_buffers(value, sampling_locations)
    return None if sort is None else key_buffers(value, sampling_locations, acc_dtype)


def kernel_args(buffers: CountingBuffers | KeyBuffers | None) -> tuple:
    """msda_bwd_kernel's ranks_ptr, counts_ptr, keys_ptr, records_ptr, CELLS
    and KEY_BIAS for ``buffers`` (sort_buffers)."""
    if isinstance(buffers, CountingBuffers):
        return buffers.ranks, buffers.counts, None, None, buffers.cells, None
    if isinstance(buffers, KeyBuffers):
        return None, None, buffers.keys, buffers.records, buffers.cells, buffers.bias
    return (None,) * 6
