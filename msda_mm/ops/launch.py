"""Allocating wrappers around the Triton kernels: output buffers, tile
choice, grid, device guard.  Inputs are assumed validated (validate.py)."""
from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton.language as tl

from . import kernels
from .fast_launch import FastLaunch

# The kernels as this module launches them: through FastLaunch (repeat
# launches skip Triton's argument binding; see fast_launch.py).
msda_fwd_kernel = FastLaunch(kernels.msda_fwd_kernel)
msda_fwd_pairs_kernel = FastLaunch(kernels.msda_fwd_pairs_kernel)
msda_bwd_kernel = FastLaunch(kernels.msda_bwd_kernel)
zero_fill_kernel = FastLaunch(kernels.zero_fill_kernel)
fixed_to_float_kernel = FastLaunch(kernels.fixed_to_float_kernel)


def interpreter_enabled() -> bool:
    """True when Triton runs kernels on the CPU (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# (BLOCK_Q, num_warps, BLOCK_P) per kernel and value element size, tuned at
# D = 32 (mmdet's 256 / 8 heads) and L * K = 16; a larger D shrinks BLOCK_Q
# to keep the registers per program (see _tile).  Chosen from 13 tiles on
# the H200 (benchmarks/NOTES.md, cold-L2 graph replays, us, decoder /
# dino_decoder / encoder presets):
# - one warp per program wins everywhere; more warps lose most in the
#   forward (bf16, 4 queries x 4 warps: 27.6 / 61.2 / 570), for reasons not
#   yet measured (layout conversions are not it: NOTES.md).
# - forward 2 queries x 16 points: bf16 16.9 / 30.8 / 209, fp32 19.6 / 35.5
#   / 250 (1 query: 17.0 / 31.0 / 265; 4 queries x 8 points: 19.7 / 32.8 /
#   199 in bf16, the only tile better on one preset).
# - backward 1 query: bf16 46.3 / 82.2 / 563 with 16 points (2 queries: 52.5
#   / 93.8 / 607); fp32 69.9 / 128 / 855 with 8 points per chunk (16: 73.2 /
#   132 / 872).
# Re-measured after the kernels lost their integer divisions and int64
# indices (session 3, benchmarks/NOTES.md): forward bf16 2 x 1 x 16 16.5 /
# 27.8 / 179, fp32 20.5 / 37.8 / 242; backward bf16 1 x 1 x 16 45.7 / 81.3 /
# 560.
_TILES = {("fwd", 4): (2, 1, 16), ("fwd", 2): (2, 1, 16),
          ("bwd", 4): (1, 1, 8), ("bwd", 2): (1, 1, 16)}
# The 2-query forward wins on large grids (encoder, 356k (batch, query, head)
# rows: bf16 179 against 224 us with 1 query), but a 16-bit decoder is
# latency-bound and gains from more, smaller programs (bf16, 9.6k rows: 15.6
# against 16.5 us; 28.8k rows: 27.5 against 27.8): below this many rows a
# 16-bit (and fp64) forward takes one query per program.  Session 5 re-tried
# the alternatives on the decoder (bf16, graph cold / CUPTI us,
# nvidia-h200-decoder-fwd-ab-s5.json): this tile 15.5 / 12.3; multi-warp tiles
# still lose (2 x 2 x 8 22.2 / 18.9, 4 x 4 x 8 36.4 / 32.8), and so does the
# pairs kernel with the points split over warps or thread groups (best: 4
# queries x 2 slices, 1 warp, 17.0 / 13.3; not shipped).  fp32 keeps 2 queries
# (fp64, for gradcheck only, was not measured and keeps 1): session 11 (graph /
# CUPTI us, benchmarks/nvidia-h200-decoder-fwd-s11.json) decoder 19.3 / 15.6
# against 20.6 / 17.1 with 1 query, dino_decoder 33.9 / 31.1 against 37.0 /
# 34.2 (bf16 there: 16.8 / 12.9 against 15.5 / 12.3).
_FWD_FEW_ROWS = 1 << 16
# msda_fwd_pairs_kernel's queries per one-warp program at D = 32 (8 x 16
# words of two channels: each thread one 16-byte load per corner row); a
# wider head takes queries off (see _pairs_tile).  Same threshold as above:
# on the H200 (benchmarks/nvidia-h200-forward-ab.json, graph cold us) the
# pairs kernel wins the encoder (bf16 170.9 / fp16 171.4 against 180.4 /
# 185.2 for msda_fwd_kernel's 2-query tile; 16 queries x 2 warps 173.2,
# 32 x 4 173.0) and loses the latency-bound decoders (decoder 19.8 against
# 15.9, dino_decoder 30.7 against 27.5, bf16).
_PAIRS_QUERIES_D32 = 8
_tile_override: dict = {}


@contextlib.contextmanager
def tile_override(fwd: tuple[int, ...] | None = None, bwd: tuple[int, ...] | None = None,
                  pairs: tuple[int, int] | None = None):
    """Launch with other (BLOCK_Q, num_warps[, BLOCK_P]) tiles inside this
    block: a tuning hook for the benchmark and the tests, not an API for
    models.  ``pairs`` (BLOCK_Q, num_warps) sends every forward that
    msda_fwd_pairs_kernel can take to it; ``fwd`` every forward to
    msda_fwd_kernel."""
    saved = dict(_tile_override)
    _tile_override.update({k: v for k, v in (("fwd", fwd), ("bwd", bwd), ("pairs", pairs))
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


def _tile(kernel: str, value: torch.Tensor, points: int, rows: int,
          element_size: int = 0) -> dict:
    """Launch constants for ``points`` = L * K sampling points per query and
    ``rows`` = B * Q * M (query, head) pairs; the tuned tile is that of
    value's element size, or of ``element_size`` where given."""
    block_q, num_warps, *block_p = _tile_override.get(
        kernel, _TILES[kernel, min(element_size or value.element_size(), 4)])
    if (kernel == "fwd" and kernel not in _tile_override and rows < _FWD_FEW_ROWS
            and value.dtype != torch.float32):
        block_q = 1
    block_p = min(_next_pow2(points), *block_p or [16])
    block_d = _next_pow2(value.shape[-1])
    # A wider head first takes queries off the tile (the registers of the
    # tuned D = 32 tile), then, past 2x the tuned elements per warp (D >= 128),
    # adds warps: one warp spilled 14 registers in the bf16 backward at
    # D = 256 and 236 with fp32 accumulation (tools/compile_check.py).
    tuned = block_q * block_p * 32
    block_q = max(1, tuned // (block_p * block_d))
    num_warps = min(8, max(num_warps, num_warps * block_q * block_p * block_d // (2 * tuned)))
    return dict(BLOCK_Q=block_q, BLOCK_P=block_p, BLOCK_D=block_d, num_warps=num_warps)


def _pairs_tile(value: torch.Tensor, rows: int, acc) -> dict | None:
    """Launch constants for msda_fwd_pairs_kernel, or None where it does not
    apply: fp16/bf16 values whose rows are whole int32 words (unit channel
    stride, even D and strides, a 4-byte aligned start), fp32 accumulation,
    and a grid past _FWD_FEW_ROWS rows (or a "pairs" tile_override)."""
    if "fwd" in _tile_override or ("pairs" not in _tile_override and rows < _FWD_FEW_ROWS):
        return None
    if (value.dtype not in (torch.float16, torch.bfloat16) or acc is not tl.float32
            or value.stride(3) != 1 or value.shape[3] % 2
            or any(st % 2 for st in value.stride()[:3]) or value.data_ptr() % 4):
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
                 attention_weights) -> torch.Tensor:
    """Non-empty inputs only (B * Q * M * D > 0).

    value (B, S, M, D); spatial_shapes (L, 2) int; level_start_index (L,)
    int; sampling_locations (B, Q, M, L, K, 2); attention_weights
    (B, Q, M, L, K).  Returns (B, Q, M * D) in value's dtype."""
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
            L=L, K=K, **meta,
        )
    return out.view(B, Q, M * D)


# zero_fill_kernel: BLOCK int32 words a program per step, at most
# _FILL_PROGRAMS_PER_SM programs per SM, so that all are resident at once
# and the backward launches as soon as each has started.  On the H200
# (session 10, 7 tiles; graph us of the backward behind the fill, uniform,
# decoder / dino_decoder; benchmarks/nvidia-h200-fill-pdl-s10.json):
# - 16-bit grad_value: this fill with PDL 38.5 / 74.8; PyTorch's fill
#   without PDL 41.2 / 78.0, with PDL (overlapping only the fill's tail)
#   40.8 / 77.2.
# - fp32: this fill with PDL 68.8 / 127.9; PyTorch's without 69.4 / 127.2,
#   with PDL 68.6 / 126.9, so fp32 keeps PyTorch's fill (alone it writes
#   4.5 TB/s, this kernel 4.3) and the backward behind it still takes PDL.
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
    decoder preset, 45.5 MB bf16 in 14.4 us, 91 MB fp32 in 20.1 us:
    benchmarks/nvidia-h200-gather-ceiling.json; as words 10.6 us:
    nvidia-h200-gather-ceiling-fill-s8.json).
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


def grad_value_bound(go: torch.Tensor, attention_weights: torch.Tensor) -> torch.Tensor:
    """(B, M) float64: a bound on |every partial sum| of grad_value[b, :, m, :]
    for grad_output ``go`` (B, Q, M, D), computed on the device (no sync).

    Each sample adds its weight times grad_output's row to four corners with
    bilinear weights summing to 1, so a query adds at most
    max_d |go[b, q, m, d]| * sum_{l,k} |w[b, q, m, l, k]| to any element; Q
    times the largest of those bounds every sum.  A max rather than the sum
    over the queries (looser by the largest query's bound over the mean one,
    about 2x for random grad_output), so that the bound, and with it the fixed
    point, is the same whatever the queries' order.  inf or NaN in go or the
    weights make it inf or NaN."""
    go_max = torch.linalg.vector_norm(go, float("inf"), dim=-1)  # exact in go's dtype
    # fp32 at least: a sum of 16-bit weights could overflow fp16.
    w_sum = torch.linalg.vector_norm(
        attention_weights, 1, dim=(-2, -1),
        dtype=torch.promote_types(attention_weights.dtype, torch.float32))
    return (go_max.double() * w_sum.double()).amax(1) * go.shape[1]


# fixed_to_float_kernel: ~2048 elements a program (64 rows of D = 32).
_CONVERT = dict(ELEMS=2048, num_warps=4)


def _fixed_to_float(acc: torch.Tensor, bound: torch.Tensor, dtype: torch.dtype,
                    acc_dtype) -> torch.Tensor:
    """msda_bwd_kernel's int64 fixed-point grad_value (B, S, M, D) as ``dtype``."""
    B, S, M, D = acc.shape
    out = torch.empty(acc.shape, device=acc.device, dtype=dtype)
    block_d = _next_pow2(D)
    block_s = max(1, _CONVERT["ELEMS"] // block_d)
    with _device_guard(acc):
        fixed_to_float_kernel[_grid(acc, S, block_s)](
            acc, bound, out, S, D, *acc.stride()[:3],
            BLOCK_S=block_s, BLOCK_D=block_d, ACC=acc_dtype, num_warps=_CONVERT["num_warps"])
    return out


def msda_backward(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                  attention_weights, fp32_grad_accum: bool, deterministic: bool = False):
    """Non-empty inputs only.  grad_output (B, Q, M * D).  Returns (grad_value, grad_loc, grad_attn),
    each contiguous in its input's dtype and shape.

    fp32_grad_accum: accumulate grad_value in an fp32 scratch buffer and
    round once at the end instead of atomically adding in value's dtype.
    deterministic: accumulate grad_value in int64 fixed point instead
    (fp32_grad_accum is then unused): bitwise the same every run (see
    kernels.py and docs/determinism.md).
    """
    B, S, M, D = value.shape
    _, Q, _, L, K, _ = sampling_locations.shape
    grad_loc = sampling_locations.new_empty(sampling_locations.shape)
    grad_attn = attention_weights.new_empty(attention_weights.shape)
    go = grad_output.unflatten(-1, (M, D))  # a view for any strides
    acc = _acc_dtype(value, sampling_locations, attention_weights)
    bound = grad_value_bound(go, attention_weights) if deterministic else None
    accum = (torch.int64 if deterministic else torch.float32 if fp32_grad_accum
             else value.dtype)
    grad_value = torch.empty(value.shape, device=value.device, dtype=accum)
    # int64 terms take registers: the fixed point takes the fp32 tile (8 points a
    # chunk), 96 registers in bf16 at D = 32 on sm_90 against 120 with 16.
    tile = _tile("bwd", value, L * K, B * Q * M, 4 if deterministic else 0)
    # The fill must be the kernel right before the backward: with PDL the
    # backward starts while the fill runs, and only its atomics wait for it.
    # (This assumes no other thread queues work on the same stream in
    # between, which PyTorch's stream semantics leave to the caller anyway.)
    pdl = fill_zeros(grad_value)
    with _device_guard(value):
        msda_bwd_kernel[_grid(value, Q, tile["BLOCK_Q"])](
            go, value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
            grad_value, grad_loc, grad_attn, bound,
            Q, S, D,
            *go.stride(), *value.stride(), *sampling_locations.stride(),
            *attention_weights.stride(),
            *grad_value.stride()[:3], *grad_loc.stride(), *grad_attn.stride(),
            L=L, K=K, ACC=acc, PDL=pdl, launch_pdl=pdl, **tile,
        )
    if deterministic:
        return _fixed_to_float(grad_value, bound, value.dtype, acc), grad_loc, grad_attn
    return grad_value.to(value.dtype), grad_loc, grad_attn
