"""Allocating wrappers around the Triton kernels: output buffers, tile
choice, grid, device guard.  Inputs are assumed validated (validate.py)."""
from __future__ import annotations

import contextlib
import functools
import os
from typing import NamedTuple

import torch
import triton.language as tl

from .backward import kernels as backward_kernels
from .deterministic import bound_kernel, gather_kernel
from .deterministic import bucket_fill_kernel as bucket_fill_jit
from .deterministic import sorted_fill_kernel as sorted_fill_jit
from .fast_launch import FastLaunch
from .forward import kernels as forward_kernels

# The kernels as this module launches them: through FastLaunch (repeat
# launches skip Triton's argument binding; see fast_launch.py).
msda_fwd_kernel = FastLaunch(forward_kernels.msda_fwd_kernel)
msda_fwd_pairs_kernel = FastLaunch(forward_kernels.msda_fwd_pairs_kernel)
msda_bwd_kernel = FastLaunch(backward_kernels.msda_bwd_kernel)
zero_fill_kernel = FastLaunch(backward_kernels.zero_fill_kernel)
grad_value_bound_kernel = FastLaunch(bound_kernel.grad_value_bound_kernel)
bucket_fill_kernel = FastLaunch(bucket_fill_jit.bucket_fill_kernel)
grad_value_gather_kernel = FastLaunch(gather_kernel.grad_value_gather_kernel)
sorted_fill_kernel = FastLaunch(sorted_fill_jit.sorted_fill_kernel)


def interpreter_enabled() -> bool:
    """True when Triton runs kernels on the CPU (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# (BLOCK_Q, num_warps, BLOCK_P) per kernel and value element size at D = 32 and
# L * K = 16 (wider heads: _tile): the fastest of 13 one- and multi-warp tiles (docs/design.md).
_TILES = {("fwd", 4): (2, 1, 16), ("fwd", 2): (2, 1, 16),
          ("bwd", 4): (1, 1, 8), ("bwd", 2): (1, 1, 16),
          # msda_bwd_kernel without grad_value (the deterministic backward): encoder
          # 212.1 us in bf16 against 289.9 at (1, 1, 8), fp32 317.1 against 387.0; below
          # _FEW_ROWS rows ("bwd_few"), the decoders, 1 query: fp32 dino_decoder 199.4 us
          # (whole backward) against 210.3 at (1, 1, 8), bf16 175.0 against 175.4 at (4, 1, 16).
          ("bwd_det", 4): (4, 1, 8), ("bwd_det", 2): (4, 1, 16),
          ("bwd_few", 4): (1, 1, 16), ("bwd_few", 2): (1, 1, 16),
          # grad_value_gather_kernel's (BLOCK_S rows, num_warps, BLOCK_E entries a step) for
          # dense rows (_GATHER_SPARSE), the stable sort's float pass: the best of 5 on the
          # encoder in fp32 (1163.3 us against 1167.1 at (8, 2, 16)), in bf16 992.2 against
          # the best 990.7 at (4, 1, 32).
          ("gather", 4): (4, 1, 16), ("gather", 2): (4, 1, 16)}
# Below this many entries a value row (4 * Q * L*K / S: decoder 0.9, dino_decoder 2.6,
# encoder 64) the deterministic backward's gather takes many rows a program: one-entry rows
# make the grid the cost (fp32 decoder 120.0 us at (32, 1, 1) against 146.3 at (8, 1, 2)).
_GATHER_SPARSE = (8, (32, 1, 1))
# Below this many entries a value row the deterministic backward takes the counting sort
# (deterministic_sort): bf16 decoder 103.0 us against the stable sort's 121.7; dino_decoder
# 198.7 against 186.2 (bf16) and 254.7 against 204.1 (fp32).
_STABLE_SORT_ENTRIES = 2
# Below this many (batch, query, head) rows a 16-bit (and fp64) forward takes 1 query a
# program: bf16 decoder 15.6 us against 16.5 with 2 (fp32 keeps 2; docs/design.md); and the
# deterministic backward's msda_bwd_kernel its "bwd_few" tile.
_FEW_ROWS = 1 << 16
# msda_fwd_pairs_kernel's queries per one-warp program at D = 32 (wider heads: _pairs_tile):
# bf16 encoder 170.9 us against 173.2 (16 x 2) and 173.0 (32 x 4) (docs/design.md).
_PAIRS_QUERIES_D32 = 8
# deterministic_sort's answers.
_SORTS = ("stable", "counting")
_tile_override: dict = {}


@contextlib.contextmanager
def tile_override(fwd: tuple[int, ...] | None = None, bwd: tuple[int, ...] | None = None,
                  pairs: tuple[int, int] | None = None,
                  gather: tuple[int, int, int] | None = None, sort: str | None = None):
    """Launch with other (BLOCK_Q, num_warps[, BLOCK_P]) tiles inside this
    block: a tuning hook for the benchmark and the tests, not an API for
    models.  ``pairs`` (BLOCK_Q, num_warps) sends every forward that
    msda_fwd_pairs_kernel can take to it; ``fwd`` every forward to
    msda_fwd_kernel; ``gather`` (BLOCK_S, num_warps, BLOCK_E) is the
    deterministic backward's grad_value_gather_kernel; ``sort`` ("stable"
    or "counting") its sort, whatever the rows' density (deterministic_sort)."""
    if sort not in (None, *_SORTS):
        raise ValueError(f"tile_override: sort must be one of {_SORTS}, got {sort!r}")
    saved = dict(_tile_override)
    _tile_override.update({k: v for k, v in (("fwd", fwd), ("bwd", bwd), ("pairs", pairs),
                                             ("gather", gather), ("sort", sort))
                           if v is not None})
    try:
        yield
    finally:
        _tile_override.clear()
        _tile_override.update(saved)


def _next_pow2(n: int) -> int:
    # Plain int arithmetic: triton.next_power_of_2 and triton.cdiv are
    # constexpr-function wrappers costing ~1.5 us a call on a dev CPU, three
    # of them per launch (each more on a slow host).
    return 1 << (n - 1).bit_length()


def _sparse_rows(value: torch.Tensor, samples: int, entries: int = _GATHER_SPARSE[0]) -> bool:
    """Whether value's rows get fewer than ``entries`` bilinear entries each
    on average from ``samples`` = Q * L * K samples a head."""
    return 4 * samples < entries * value.shape[1]


def deterministic_sort(value: torch.Tensor, samples: int) -> str:
    """How the deterministic backward buckets ``samples`` = Q * L * K samples
    a head by cell for value (B, S, M, D): "stable" (sorted_buckets.py: a
    stable radix sort, then grad_value summed in float in sample order, one
    pass) for rows of _STABLE_SORT_ENTRIES entries or more, "counting"
    (atomic ranks, then integer sums at each row's exponent, two passes:
    bucket_kernels.py) for sparser ones, where the radix sort's fixed cost
    outweighs the pass it saves (tile_override's ``sort`` overrides)."""
    return _tile_override.get("sort") or (
        "counting" if _sparse_rows(value, samples, _STABLE_SORT_ENTRIES) else "stable")


def _tile(kernel: str, value: torch.Tensor, points: int, rows: int,
          element_size: int = 0) -> dict:
    """Launch constants for ``points`` = L * K sampling points per query and
    ``rows`` = B * Q * M (query, head) pairs; the tuned tile is that of
    value's element size, or of ``element_size`` where given.  The gather
    takes ``points`` = Q * L * K samples a head and ``rows`` = B * S * M;
    "bwd_det" is msda_bwd_kernel without grad_value (tile_override's ``bwd``
    overrides either)."""
    if kernel == "bwd_det" and rows < _FEW_ROWS:
        kernel = "bwd_few"
    tile = _TILES[kernel, min(element_size or value.element_size(), 4)]
    kernel = "bwd" if kernel.startswith("bwd") else kernel
    block_q, num_warps, *block_p = _tile_override.get(kernel, tile)
    if kernel not in _tile_override:
        if kernel == "gather" and _sparse_rows(value, points):
            block_q, num_warps, *block_p = _GATHER_SPARSE[1]
        if kernel == "fwd" and rows < _FEW_ROWS and value.dtype != torch.float32:
            block_q = 1
    block_p = min(_next_pow2(points), *block_p or [16])
    block_d = _next_pow2(value.shape[-1])
    # A wider head first takes queries off the tile (the registers of the
    # tuned D = 32 tile), then, past 2x the tuned elements per warp (D >= 128),
    # adds warps: one warp spilled 14 registers in the bf16 backward at
    # D = 256 and 236 with fp32 accumulation (research/compile_check.py).
    tuned = block_q * block_p * 32
    block_q = max(1, tuned // (block_p * block_d))
    if kernel == "gather":
        # Every thread keeps each row's four cells' run, largest exponent and entry count (a
        # warp's threads share the rows): past D = 32 the rows shrink with D once more.
        block_q = max(1, block_q * 32 // max(block_d, 32))
    num_warps = min(8, max(num_warps, num_warps * block_q * block_p * block_d // (2 * tuned)))
    return dict(BLOCK_Q=block_q, BLOCK_P=block_p, BLOCK_D=block_d, num_warps=num_warps)


def _half_words(t: torch.Tensor) -> bool:
    """Whether t's (..., D) rows are whole int32 words of two fp16/bf16
    channels: unit channel stride, even D and strides, a 4-byte aligned start."""
    return (t.dtype in (torch.float16, torch.bfloat16) and t.stride(-1) == 1
            and t.shape[-1] % 2 == 0 and not any(st % 2 for st in t.stride()[:-1])
            and t.data_ptr() % 4 == 0)


def _pairs_tile(value: torch.Tensor, rows: int, acc) -> dict | None:
    """Launch constants for msda_fwd_pairs_kernel, or None where it does not
    apply: fp16/bf16 values whose rows are whole int32 words (unit channel
    stride, even D and strides, a 4-byte aligned start), fp32 accumulation,
    and a grid past _FEW_ROWS rows (or a "pairs" tile_override)."""
    if "fwd" in _tile_override or ("pairs" not in _tile_override and rows < _FEW_ROWS):
        return None
    if not _half_words(value) or acc is not tl.float32:
        return None
    block_d = _next_pow2(value.shape[3])
    block_q, num_warps = _tile_override.get(
        "pairs", (max(1, _PAIRS_QUERIES_D32 * 32 // block_d), 1))
    return dict(BLOCK_Q=block_q, BLOCK_D=block_d, num_warps=num_warps)


def _acc_dtype(*tensors: torch.Tensor):
    # fp32 registers for fp32/fp16/bf16; fp64 only when asked for (gradcheck).
    return tl.float64 if any(t.dtype == torch.float64 for t in tensors) else tl.float32


def _device_guard(t: torch.Tensor):
    # Launch on the tensors' device, not the current one (cuda:1 inputs
    # while cuda:0 is current must work).  Entering torch.cuda.device costs
    # host time, so only when it changes anything.
    if t.is_cuda and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


# CUDA's limit on a grid's second and third dimensions (heads M and batch B).
_GRID_YZ_MAX = 65535


def _grid(value: torch.Tensor, Q: int, block_q: int):
    """(query blocks, M, B) for value (B, S, M, D), or ValueError for shapes
    the kernels do not take: M or B past the grid's limits, or S past int32
    (the kernels index positions in int32)."""
    B, S, M, _ = value.shape
    if max(B, M) > _GRID_YZ_MAX or S >= 2**31:
        raise ValueError(f"value {tuple(value.shape)}: the Triton kernels take at most "
                         f"{_GRID_YZ_MAX} batches B and heads M and fewer than 2**31 positions S")
    return (-(-Q // block_q), M, B)


def msda_forward(value, spatial_shapes, level_start_index, sampling_locations,
                 attention_weights, softmax: bool = False) -> torch.Tensor:
    """Non-empty inputs only (B * Q * M * D > 0).

    value (B, S, M, D); spatial_shapes (L, 2) int; level_start_index (L,)
    int; sampling_locations (B, Q, M, L, K, 2); attention_weights
    (B, Q, M, L, K), or with ``softmax`` logits whose softmax over the
    L * K points the kernel takes.  Returns (B, Q, M * D) in value's dtype."""
    B, S, M, D = value.shape
    _, Q, _, L, K, _ = sampling_locations.shape
    out = value.new_empty(B, Q, M, D)
    acc = _acc_dtype(value, sampling_locations, attention_weights)
    meta = _pairs_tile(value, B * Q * M, acc)
    if meta is not None:
        # The pairs kernel takes no channel strides (they are 1): 3 strides
        # of value and out each, where msda_fwd_kernel takes all 4.
        kernel, strides = msda_fwd_pairs_kernel, 3
    else:
        kernel, strides = msda_fwd_kernel, 4
        meta = dict(_tile("fwd", value, L * K, B * Q * M), ACC=acc)
    with _device_guard(value):
        kernel[_grid(value, Q, meta["BLOCK_Q"])](
            value, spatial_shapes, level_start_index, sampling_locations, attention_weights, out,
            Q, S, D,
            *value.stride()[:strides], *sampling_locations.stride(),
            *attention_weights.stride(), *out.stride()[:strides],
            L=L, K=K, SOFTMAX=softmax, **meta,
        )
    return out.view(B, Q, M * D)


# zero_fill_kernel: at most _FILL_PROGRAMS_PER_SM programs an SM, all resident, so the backward
# launched behind it (PDL) starts at once: bf16 decoder 41.2 -> 38.5 us (docs/design.md).
_FILL = dict(BLOCK=4096, num_warps=4)
_FILL_PROGRAMS_PER_SM = 4


@functools.lru_cache(maxsize=None)
def _device_facts(index: int) -> tuple[tuple[int, int], int]:
    """(compute capability, SM count) of CUDA device ``index``, asked once:
    every backward needs both (two property lookups a call otherwise, ~9% of
    the backward launcher's profiled time on the H200 box)."""
    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor), props.multi_processor_count


def pdl_available(device: torch.device) -> bool:
    """Programmatic dependent launch (a kernel starting before the one before
    it has finished): NVIDIA devices of compute capability >= 9.0, outside
    the interpreter (which has no inline PTX)."""
    return (device.type == "cuda" and torch.version.hip is None and not interpreter_enabled()
            and _device_facts(_index(device))[0] >= (9, 0))


def _index(device: torch.device) -> int:
    return torch.cuda.current_device() if device.index is None else device.index


def fill_zeros(t: torch.Tensor) -> bool:
    """Zero the contiguous tensor ``t`` in place with one kernel.  Returns
    whether the next kernel may be launched with PDL: ``t``'s device has it
    and a fill kernel ran (all work before it has finished, and the next
    kernel's gdc_wait waits for the fill itself).

    zero_fill_kernel, which lets the next kernel start at once, zeroes
    16-bit buffers of whole 4-byte words where PDL exists, and every
    buffer of whole words in the interpreter (so that the CPU tests run
    the kernel sm_90 runs).  Everything else goes through PyTorch's fill,
    16-bit buffers of even size as int32 words: PyTorch wrote 16-bit zeros
    at 3.2 TB/s on the H200 against 4.5 TB/s for fp32 (grad_value of the
    decoder preset, 45.5 MB bf16 in 14.4 us, 91 MB fp32 in 20.1 us; as
    words 10.6 us: docs/design.md).
    """
    flat = t.view(-1)
    if not flat.numel():
        return False  # nothing to fill: no kernel right before the next one
    pdl = pdl_available(t.device)
    whole_words = flat.numel() * t.element_size() % 4 == 0
    if not whole_words or not (interpreter_enabled() or (pdl and t.element_size() == 2)):
        if t.element_size() == 2 and whole_words:
            flat = flat.view(torch.int32)
        flat.zero_()
        return pdl
    words = flat.view(torch.int32)
    n = words.numel()
    blocks = -(-n // _FILL["BLOCK"])
    # The interpreter has no SMs to fill; two programs still take the
    # grid-stride loop through more than one step.
    resident = _device_facts(_index(t.device))[1] * _FILL_PROGRAMS_PER_SM if t.is_cuda else 2
    with _device_guard(t):
        zero_fill_kernel[(min(blocks, resident),)](words, n, PDL=pdl, **_FILL)
    return pdl


# grad_value_bound_kernel's tile: 2048 grad_output elements a 4-warp program (16 a thread).
_BOUND = dict(ELEMENTS=2048, num_warps=4)


def grad_value_bound(go: torch.Tensor, attention_weights: torch.Tensor,
                     query_max: torch.Tensor | None = None) -> torch.Tensor:
    """(B, M) float64: a bound on |every partial sum| of grad_value[b, :, m, :]
    for grad_output ``go`` (B, Q, M, D), computed on the device (no sync) by
    bound_kernel.py.

    Each sample adds its weight times grad_output's row to four corners with
    bilinear weights summing to 1, so a query adds at most
    max_d |go[b, q, m, d]| * sum_{l,k} |w[b, q, m, l, k]| to any element; Q
    times the largest of those bounds every sum.  A max rather than the sum
    over the queries (looser by the largest query's bound over the mean one,
    about 2x for random grad_output), so that the bound, which decides whether
    the head gets a result (fixed_point._head_ok), is the same whatever the
    queries' order.  inf or NaN in go or the weights make it inf or NaN.
    ``query_max``, a (B, Q, M) tensor (fp32; fp64 for fp64 ``go``): also each
    query's max_d |go[b, q, m, d]|, from which the gather takes each value
    row's exponent."""
    B, Q, M, D = go.shape
    _, _, _, L, K = attention_weights.shape
    bound = torch.zeros(B, M, device=go.device, dtype=torch.float64)
    block_d = _next_pow2(D)
    block_q = max(1, _BOUND["ELEMENTS"] // block_d)
    wide = [tl.float64 if t.dtype == torch.float64 else tl.float32
            for t in (go, attention_weights)]
    with _device_guard(go):
        grad_value_bound_kernel[_grid(go, Q, block_q)](
            go, attention_weights, bound.view(torch.int64), query_max, Q, D, *go.stride(),
            *attention_weights.stride(), L=L, K=K, BLOCK_Q=block_q,
            BLOCK_P=min(_next_pow2(L * K), _BOUND["ELEMENTS"] // block_q), BLOCK_D=block_d,
            MAX_TY=wide[0], SUM_TY=wide[1], num_warps=_BOUND["num_warps"])
    return bound


# bucket_fill_kernel's and the stable sort's kernels' tile: 128 samples a 4-warp program,
# one a thread.
_SORT = dict(SAMPLES=128, num_warps=4)


def _cells(S: int, L: int) -> int:
    """Cells of a head's extended grids, sum_l (H_l+1) * (W_l+1), bounded
    without reading the shapes (a host sync on CUDA): (H-1) * (W-1) >= 0
    gives H + W + 1 <= H * W + 2, so the sum is at most 2 * S + 2 * L."""
    return 2 * S + 2 * L


class SortBuffers(NamedTuple):
    """The counting sort's buffers (bucket_kernels.py), msda_bwd_kernel's to
    fill: bucket (b * M + m) * cells + c counts its samples at counts[1 + i]
    (zeros first), each sample's rank in its bucket goes to ranks."""
    cells: int
    counts: torch.Tensor  # (B * M * cells + 1,), of ranks' dtype
    ranks: torch.Tensor  # (B * M * Q * L*K,)


def _sort_sizes(value, sampling_locations) -> tuple[int, int, int, torch.dtype]:
    """cells a head, samples, buckets + 1, and the index dtype of both sorts'
    counts, offsets, ranks and keys: int32 where all fit."""
    B, S, M, _ = value.shape
    _, Q, _, L, K, _ = sampling_locations.shape
    cells = _cells(S, L)
    samples, buckets = B * M * Q * L * K, B * M * cells + 1
    return cells, samples, buckets, (torch.int32 if max(samples, buckets) < 2**31
                                     else torch.int64)


def sort_buffers(value, sampling_locations) -> SortBuffers:
    """Zeroed counts and the ranks for the samples of these locations."""
    cells, samples, buckets, index = _sort_sizes(value, sampling_locations)
    return SortBuffers(cells, torch.zeros(buckets, device=value.device, dtype=index),
                       torch.empty(samples, device=value.device, dtype=index))


def _record_words(acc_dtype) -> torch.dtype:
    # A record's 4 words hold acc_dtype's bits.
    return torch.int64 if acc_dtype is tl.float64 else torch.int32


def _sample_tile(L: int, K: int, acc_dtype) -> dict:
    """bucket_fill_kernel's launch constants."""
    block_p = min(_next_pow2(L * K), _SORT["SAMPLES"])
    return dict(BLOCK_Q=_SORT["SAMPLES"] // block_p, BLOCK_P=block_p, ACC=acc_dtype,
                num_warps=_SORT["num_warps"])


def _key_dtype(cells: int) -> tuple[torch.dtype, int]:
    """The stable sort's keys, a cell in [0, cells] plus a bias: int16 where
    cells + 1 keys fit (torch.sort of the encoder's 5.7 M samples: 175.1 us,
    311.9 with 32-bit keys), else int32."""
    return (torch.int16, -2**15) if cells < 2**16 else (torch.int32, 0)


class KeyBuffers(NamedTuple):
    """The stable sort's input (sorted_buckets.py), msda_bwd_kernel's to
    fill: each sample's key (its cell in its head plus ``bias``) and its
    record (cells._record_words), both at its slot."""
    cells: int
    bias: int
    keys: torch.Tensor  # (B * M * Q * L*K,)
    records: torch.Tensor  # (B * M * Q * L*K, 4)


def key_buffers(value, sampling_locations, acc_dtype) -> KeyBuffers:
    """The keys and records for the samples of these locations."""
    cells, samples, _, _ = _sort_sizes(value, sampling_locations)
    key_dtype, bias = _key_dtype(cells)
    return KeyBuffers(cells, bias, torch.empty(samples, device=value.device, dtype=key_dtype),
                      torch.empty(samples, 4, device=value.device,
                                  dtype=_record_words(acc_dtype)))


def stable_bucket_records(value, sampling_locations, keyed: KeyBuffers):
    """The samples bucketed by cell by a stable sort of msda_bwd_kernel's
    keys (sorted_buckets.py): (bounds, records), bucket (head, cell) holding
    records bounds[0, i] .. bounds[1, i], i = cell * B * M + head, its
    entries in sample order, the same every run."""
    B, Q, M, L, K, _ = sampling_locations.shape
    cells, samples, _, index = _sort_sizes(value, sampling_locations)
    with _device_guard(value):
        sorted_keys, perm = torch.sort(keyed.keys, stable=True)
        bounds = torch.zeros(2, cells * B * M, device=value.device, dtype=index)
        records = torch.empty_like(keyed.records)
        sorted_fill_kernel[(-(-samples // _SORT["SAMPLES"]),)](
            sorted_keys, perm, keyed.records, records, bounds, samples, cells, B * M, Q * L * K,
            keyed.bias, BLOCK=_SORT["SAMPLES"], num_warps=_SORT["num_warps"])
    return bounds, records


def bucket_records(value, spatial_shapes, sampling_locations, attention_weights,
                   sort: SortBuffers, acc_dtype):
    """The samples counting-sorted by cell from msda_bwd_kernel's ranks:
    (offsets, records), where bucket i holds entries offsets[i]:offsets[i + 1]
    in an order that varies run to run; entry j's record records[j] (4 words:
    int32 for fp32 acc_dtype, int64 for fp64) holds its query and the bits of
    its attention weight and bilinear fractions lx, ly (acc_dtype)."""
    _, Q, _, L, K, _ = sampling_locations.shape
    records = torch.empty(sort.ranks.numel(), 4, device=value.device,
                          dtype=_record_words(acc_dtype))
    fill = _sample_tile(L, K, acc_dtype)
    offsets = sort.counts
    with _device_guard(value):
        # Exclusive starts: counts[0] stays 0, bucket i's count was at i + 1.
        offsets.cumsum_(0)
        bucket_fill_kernel[_grid(value, Q, fill["BLOCK_Q"])](
            spatial_shapes, sampling_locations, attention_weights, sort.ranks, offsets, records,
            Q, sort.cells, *sampling_locations.stride(), *attention_weights.stride(),
            L=L, K=K, **fill)
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


def _buckets(go, value, spatial_shapes, sampling_locations, attention_weights,
             sort: SortBuffers | KeyBuffers, acc_dtype) -> Buckets:
    """The samples that msda_bwd_kernel ranked (SortBuffers: the counting
    sort) or keyed (KeyBuffers: the stable sort) in their buckets."""
    if isinstance(sort, KeyBuffers):
        bounds, records = stable_bucket_records(value, sampling_locations, sort)
        B, _, M, _ = value.shape
        return Buckets(sort.cells, bounds[0], bounds[1], (1, B * M), records, None, None)
    B, Q, M = attention_weights.shape[:3]
    query_max = torch.empty(B, Q, M, device=value.device, dtype=torch.float64
                            if go.dtype == torch.float64 else torch.float32)
    bound = grad_value_bound(go, attention_weights, query_max)
    offsets, records = bucket_records(value, spatial_shapes, sampling_locations,
                                      attention_weights, sort, acc_dtype)
    return Buckets(sort.cells, offsets, offsets[1:], (sort.cells, 1), records, bound, query_max)


def _deterministic_grad_value(go, value, spatial_shapes, level_start_index, buckets: Buckets,
                              samples: int, Q: int, acc_dtype) -> torch.Tensor:
    """grad_value in value's dtype, without atomics, gathered per value row
    from the bucketed samples (bucket_kernels.py; ``samples`` a head's, Q
    queries).  With the counting sort summed as integers at the row's own
    exponent (fixed_point.py: int64; 16-bit values int32 from terms rounded
    in fp32, exact_sums.py); with the stable sort summed in float in sample
    order."""
    B, S, M, D = value.shape
    fixed = buckets.bound is not None
    grad_value = torch.empty(value.shape, device=value.device, dtype=value.dtype)
    # A bucket holds at most a head's samples: BLOCK_E needs no more.
    tile = _tile("gather", value, samples, B * S * M)
    with _device_guard(value):
        grad_value_gather_kernel[_grid(value, S, tile["BLOCK_Q"])](
            go, spatial_shapes, level_start_index, buckets.bound, buckets.query_max, buckets.lo,
            buckets.hi, buckets.records, grad_value, Q, S, buckets.cells, *buckets.strides, D,
            *go.stride(), *grad_value.stride()[:3],
            L=spatial_shapes.shape[0], BLOCK_S=tile["BLOCK_Q"], BLOCK_E=tile["BLOCK_P"],
            BLOCK_D=tile["BLOCK_D"], ACC=acc_dtype, FIXED=fixed,
            FP32_TERMS=value.element_size() == 2 and acc_dtype is tl.float32,
            PAIRS=(not fixed and acc_dtype is tl.float32 and go.dtype == value.dtype
                   and _half_words(go) and _half_words(grad_value) and Q * go.stride(1) < 2**31),
            num_warps=tile["num_warps"])
    return grad_value


def _sort_buffers(det_sort: str | None, value, sampling_locations,
                  acc_dtype) -> SortBuffers | KeyBuffers | None:
    """What msda_bwd_kernel fills for the deterministic backward's sort:
    the counting sort's ranks or the stable sort's keys and records."""
    if det_sort == "counting":
        return sort_buffers(value, sampling_locations)
    return None if det_sort is None else key_buffers(value, sampling_locations, acc_dtype)


def _sort_args(sort: SortBuffers | KeyBuffers | None) -> tuple:
    """msda_bwd_kernel's ranks_ptr, counts_ptr, keys_ptr, records_ptr, CELLS
    and KEY_BIAS for ``sort`` (_sort_buffers)."""
    if isinstance(sort, SortBuffers):
        return sort.ranks, sort.counts, None, None, sort.cells, None
    if isinstance(sort, KeyBuffers):
        return None, None, sort.keys, sort.records, sort.cells, sort.bias
    return (None,) * 6


class BackwardPlan(NamedTuple):
    """plan_backward's launch constants of msda_bwd_kernel."""
    grid: tuple
    meta: dict  # tile, L, K, ACC, SOFTMAX
    accum: torch.dtype | None  # grad_value's atomics dtype; None: deterministic
    sort: str | None  # the deterministic backward's deterministic_sort
    g_dtype: torch.dtype  # the weights' gradient as the kernel stores it
    strides: tuple  # value's, the locations' and the weights'
    sizes: tuple  # Q, S, D
    heads: int  # M


def plan_backward(value, sampling_locations, attention_weights, fp32_grad_accum: bool,
                  deterministic: bool = False, softmax: bool = False) -> BackwardPlan:
    """What msda_backward's launches take from the forward's inputs alone:
    the tile, grid, accumulator dtypes and those inputs' strides.  Made on
    the forward's thread, it takes that Python off autograd's device thread,
    where the backward's Python runs about 2x slower than on the calling thread
    (docs/design.md)."""
    if softmax and deterministic:
        raise ValueError("msda_backward: softmax=True takes the float-atomic backward only, "
                         "got deterministic=True (run it on point_softmax(logits) instead)")
    B, S, M, D = value.shape
    _, Q, _, L, K, _ = sampling_locations.shape
    acc = _acc_dtype(value, sampling_locations, attention_weights)
    # Without grad_value a tile of its own up to D = 64; past it the fp32 float backward's
    # (8 points a chunk): the 16-bit one spilled at D = 256 on sm_90 (1 register;
    # research/compile_check.py).
    if deterministic and D <= 64:
        tile = _tile("bwd_det", value, L * K, B * Q * M)
    else:
        tile = _tile("bwd", value, L * K, B * Q * M, 4 if deterministic else 0)
    # The kernel stores the weights' gradient g in g_attn; with softmax, the
    # logits' p * (g - sum(p * g)) in grad_attn after it.  g in point_softmax's
    # dtype (fp32 at least), as the unfused backward had it: 16-bit g would
    # round (2**-9 for bf16) before that subtraction cancels.
    g_dtype = (torch.promote_types(attention_weights.dtype, torch.float32) if softmax
               else attention_weights.dtype)
    accum = None if deterministic else (torch.float32 if fp32_grad_accum else value.dtype)
    sort = deterministic_sort(value, Q * L * K) if deterministic else None
    strides = (*value.stride(), *sampling_locations.stride(), *attention_weights.stride())
    return BackwardPlan(_grid(value, Q, tile["BLOCK_Q"]),
                        dict(tile, L=L, K=K, ACC=acc, SOFTMAX=softmax), accum, sort, g_dtype,
                        strides, (Q, S, D), M)


def run_backward(plan: BackwardPlan, grad_output, value, spatial_shapes, level_start_index,
                 sampling_locations, attention_weights):
    """msda_backward with its plan_backward made before."""
    grid, meta, accum, det_sort, g_dtype, strides, sizes, M = plan
    # torch.empty: one aten op where new_empty is two.
    grad_loc = torch.empty(sampling_locations.shape, dtype=sampling_locations.dtype,
                           device=value.device)
    grad_attn = torch.empty(attention_weights.shape, dtype=attention_weights.dtype,
                            device=value.device)
    g_attn, grad_logit = grad_attn, None
    if meta["SOFTMAX"]:
        grad_logit = grad_attn
        if g_dtype != grad_attn.dtype:
            g_attn = torch.empty_like(grad_attn, dtype=g_dtype)
    # grad_output (B, Q, M * D) read as (B, Q, M, D) by its strides: no view op.
    gob, goq, goc = grad_output.stride()
    go_strides = (gob, goq, sizes[2] * goc, goc)
    grad_value, pdl, gv_strides = None, False, (0, 0, 0)
    sort = _sort_buffers(det_sort, value, sampling_locations, meta["ACC"])
    if accum is not None:
        grad_value = torch.empty(value.shape, device=value.device, dtype=accum)
        gv_strides = grad_value.stride()[:3]
        # The fill must be the kernel right before the backward: with PDL the
        # backward starts while the fill runs, and only its atomics wait for it.
        # (This assumes no other thread queues work on the same stream in
        # between, which PyTorch's stream semantics leave to the caller anyway.)
        pdl = fill_zeros(grad_value)
    with _device_guard(value):
        msda_bwd_kernel[grid](
            grad_output, value, spatial_shapes, level_start_index, sampling_locations,
            attention_weights, grad_value, grad_loc, g_attn, grad_logit, *_sort_args(sort),
            *sizes, *go_strides, *strides, *gv_strides, *grad_loc.stride(), *g_attn.stride(),
            PDL=pdl, launch_pdl=pdl, **meta,
        )
    if accum is None:
        go = grad_output.unflatten(-1, (M, sizes[2]))
        buckets = _buckets(go, value, spatial_shapes, sampling_locations, attention_weights, sort,
                           meta["ACC"])
        del sort  # the stable sort's keys and records in sample order: freed before the gather
        grad_value = _deterministic_grad_value(go, value, spatial_shapes, level_start_index,
                                               buckets, sizes[0] * meta["L"] * meta["K"],
                                               sizes[0], meta["ACC"])
    elif accum != value.dtype:
        grad_value = grad_value.to(value.dtype)
    return grad_value, grad_loc, grad_attn


def msda_backward(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                  attention_weights, fp32_grad_accum: bool, deterministic: bool = False,
                  softmax: bool = False):
    """Non-empty inputs only.  grad_output (B, Q, M * D).  Returns (grad_value,
    grad_loc, grad_attn), each contiguous in its input's dtype and shape.

    fp32_grad_accum: accumulate grad_value in an fp32 scratch buffer and
    round once at the end instead of atomically adding in value's dtype.
    deterministic: gather grad_value per value row without atomics instead,
    from the samples sorted by cell (deterministic_sort: a stable sort and
    float sums in sample order, or a counting sort and integer sums at each
    row's own exponent; fp32_grad_accum is then unused): bitwise the same
    every run (see bucket_kernels.py and docs/determinism.md).
    softmax: attention_weights are logits (msda_forward's ``softmax``) and
    grad_attn is their gradient, taken in the same kernel; not with
    ``deterministic``, whose grad_value takes the weights themselves (msda.py
    runs that backward on point_softmax's weights).
    """
    plan = plan_backward(value, sampling_locations, attention_weights, fp32_grad_accum,
                         deterministic, softmax)
    return run_backward(plan, grad_output, value, spatial_shapes, level_start_index,
                        sampling_locations, attention_weights)
