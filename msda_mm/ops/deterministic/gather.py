"""The deterministic backward's grad_value, gathered per value row from the
samples sorted into buckets by cell (grad_value_gather_kernel).  Rows with
few entries (Tiles.deterministic_sort: under 2 a row, the Deformable DETR
decoder) take the counting sort (bucket_fill.py), whose order inside
a bucket varies, and sum integer terms at the row's own exponent
(fixed_point.py: int64; for 16-bit values int32 sums of terms rounded in
fp32, exact_sums.py); denser rows (the encoders, DINO's decoder) take the
stable sort (sorted_fill.py), whose order is the samples', and sum
in float in that order.

The counting sort's gather makes two passes over a row's entries: the
first (a max and a count: the row's exponent, neither dependent on the
entries' order) loads each entry's 16-byte record (32 for fp64) and its
query's max |grad_output| (4 bytes, 8 for fp64); the second loads both
again and the query's grad_output row (D elements), or in a head with
inf or NaN in its grad_output or weights one channel of it a channel at
a time, its inf and NaN terms summed apart (nonfinite.py).  The stable
sort's gather makes only the second pass, without the maxima.

Value row (y, x) of a level is corner 11 of cell (y-1, x-1), 10 of
(y-1, x), 01 of (y, x-1) and 00 of (y, x): extended cells (y, x), (y, x+1),
(y+1, x) and (y+1, x+1).  grad_value_gather_kernel reads their entries as
one run a row, wherever each bucket lies: the counting sort's buckets run by
head, then cell, the stable sort's by cell, then head.
"""
import triton
import triton.language as tl

from ..jit_helpers import head_base, pair_halves, pair_words, program_tile, row_ptrs
from ..sampling import bilinear_weight, level_size, level_start
from .bound import query_max_ptrs
from .cells import ext_start
from .exact_sums import SUM_BITS, TERM_BITS, integer_terms
from .fixed_point import (
    FIXED_BITS,
    NO_ENTRY,
    entry_exponent,
    fixed_point_terms,
    fixed_to_float,
    head_bound,
    head_finite,
    row_exponent,
)
from .nonfinite import nonfinite_terms
from .records import record_fields, record_ptrs


@triton.jit
def _row_levels(s, shapes_ptr, L: tl.constexpr):
    """Level l of each value row s and its H, W, start (int32, s's shape)."""
    lvl = tl.zeros(s.shape, dtype=tl.int32)
    start = tl.zeros([], dtype=tl.int32)  # level j's
    for j in tl.static_range(1, L):
        start += level_size(shapes_ptr, j - 1)
        lvl += (s >= start).to(tl.int32)
    H = tl.load(shapes_ptr + 2 * lvl).to(tl.int32)
    W = tl.load(shapes_ptr + 2 * lvl + 1).to(tl.int32)
    return lvl, H, W, level_start(shapes_ptr, lvl, L)


@triton.jit
def _cell_entries(base, corner: tl.constexpr, W, row_ok, head, lo_ptr, hi_ptr, HEAD_STRIDE,
                  CELL_STRIDE, CELLS):
    """Extended cell base + (corner // 2, corner % 2) of each row (base: its
    cell (y, x)): its first entry and its count, 0 outside the cells.  Bucket
    (head, cell) holds entries lo[i] .. hi[i], i = head * HEAD_STRIDE + cell
    * CELL_STRIDE."""
    cell = base + (corner // 2) * (W + 1) + corner % 2
    valid = row_ok & (cell >= 0) & (cell < CELLS)
    i = head * HEAD_STRIDE + cell * CELL_STRIDE
    first = tl.load(lo_ptr + i, mask=valid, other=0)
    return first, tl.load(hi_ptr + i, mask=valid, other=0) - first


@triton.jit
def _row_cells(lvl, y, x, W, row_ok, head, lo_ptr, hi_ptr, HEAD_STRIDE, CELL_STRIDE,
               shapes_ptr, CELLS, L: tl.constexpr):
    """The entries of the four extended cells (y + dy, x + dx) each row is a
    corner of, dy, dx in {0, 1}, in that order (the row is their samples'
    corner 11, 10, 01 and 00), as one run: cell k's entries are the run's
    e_(k-1) .. e_k (e_-1 = 0, e_3 = n), its j-th at j + d_k.  Returns d0 ..
    d3, e0, e1, e2 and n, each [BLOCK_S, 1]."""
    base = ext_start(lvl, shapes_ptr, L) + y.to(tl.int64) * (W + 1) + x
    f0, n0 = _cell_entries(base, 0, W, row_ok, head, lo_ptr, hi_ptr, HEAD_STRIDE, CELL_STRIDE,
                           CELLS)
    f1, n1 = _cell_entries(base, 1, W, row_ok, head, lo_ptr, hi_ptr, HEAD_STRIDE, CELL_STRIDE,
                           CELLS)
    f2, n2 = _cell_entries(base, 2, W, row_ok, head, lo_ptr, hi_ptr, HEAD_STRIDE, CELL_STRIDE,
                           CELLS)
    f3, n3 = _cell_entries(base, 3, W, row_ok, head, lo_ptr, hi_ptr, HEAD_STRIDE, CELL_STRIDE,
                           CELLS)
    e0 = n0
    e1 = e0 + n1
    e2 = e1 + n2
    return (f0[:, None], (f1 - e0)[:, None], (f2 - e1)[:, None], (f3 - e2)[:, None],
            e0[:, None], e1[:, None], e2[:, None], (e2 + n3)[:, None])


@triton.jit
def _entries(records_ptr, d0, d1, d2, d3, e0, e1, e2, n, j0, BLOCK_E: tl.constexpr,
             ACC: tl.constexpr):
    """Entries j0 .. j0 + BLOCK_E of each row's run of four cells
    (_row_cells): live, query (int64) and the corner weight of the row's
    role ([BLOCK_S, BLOCK_E] each; 0 where not live)."""
    j = j0 + tl.arange(0, BLOCK_E)[None, :]
    live = j < n
    in1 = j >= e0
    in2 = j >= e1
    in3 = j >= e2
    pos = (j + tl.where(in3, d3, tl.where(in2, d2, tl.where(in1, d1, d0)))).to(tl.int64)
    q, w, lx, ly = record_fields(
        tl.load(record_ptrs(records_ptr, pos), mask=live[:, :, None], other=0), ACC)
    # Cells 0 and 1 lie above the row (it is their bottom corner), 0 and 2 left of it.
    k = in1.to(tl.int32) + in2.to(tl.int32) + in3.to(tl.int32)
    return live, q, bilinear_weight(w, lx, ly, k < 2, k % 2 == 0)


@triton.jit
def _query_max(gq_ptr, b, m, q, live, Q, ACC: tl.constexpr):
    """max_d |grad_output[b, q, m, :]| of the entries' queries in ACC, from
    the bound kernel's (B, Q, M) array (grid dim 1 is M); 0 where not live."""
    return tl.load(query_max_ptrs(gq_ptr, b, q, m, Q), mask=live, other=0.0).to(ACC)


@triton.jit
def _fixed_terms(c, g, go, e, FP32_TERMS: tl.constexpr):
    """The fixed-point terms c * go * 2**e as integers: rounded in fp32 and
    int32 (exact_sums.py) with FP32_TERMS, else truncated to int64."""
    if FP32_TERMS:
        return integer_terms(c, g, go, e)
    else:
        return fixed_point_terms(c, g, go, e)


@triton.jit
def _gather_channels(channels, gv_base, s, rmask, stride_gvs, go_base, gq_ptr, records_ptr, b, m,
                     d0, d1, d2, d3, e0, e1, e2, n, e, Q, stride_goq, stride_god,
                     BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr, ACC: tl.constexpr,
                     FP32_TERMS: tl.constexpr):
    """The fixed-point gather's second pass for a head with inf or NaN
    input (channels = D; 0 for the others): a channel at a time, the finite
    terms summed exactly at the rows' exponents e, as the kernel's tile
    sums them, and the terms with an inf or NaN factor apart in float
    (nonfinite.py), that sum the element's result where it is not 0.  A
    channel at a time, so that its sums take [BLOCK_S] registers, fewer
    than the tile's."""
    for d in range(channels):
        acc = tl.zeros([BLOCK_S, 1], dtype=tl.int32 if FP32_TERMS else tl.int64)
        nonfinite = tl.zeros([BLOCK_S, 1], dtype=ACC)
        for j0 in range(0, tl.max(tl.reshape(n, [BLOCK_S]), axis=0), BLOCK_E):
            live, q, c = _entries(records_ptr, d0, d1, d2, d3, e0, e1, e2, n, j0, BLOCK_E, ACC)
            g = _query_max(gq_ptr, b, m, q, live, Q, ACC)
            go = tl.load(go_base + q[:, :, None] * stride_goq + d * stride_god,
                         mask=live[:, :, None], other=0.0).to(ACC)
            acc += tl.sum(_fixed_terms(c, g, go, e, FP32_TERMS), axis=1)
            nonfinite += tl.sum(nonfinite_terms(c[:, :, None], go), axis=1)
        ty = gv_base.dtype.element_ty
        out = tl.where(nonfinite != 0, nonfinite.to(ty), fixed_to_float(acc, e, ty, ACC))
        tl.store(gv_base + s.to(tl.int64)[:, None] * stride_gvs + d, out, mask=rmask[:, None])


@triton.jit
def _row_exponents(gq_ptr, records_ptr, b, m, d0, d1, d2, d3, e0, e1, e2, n, Q,
                   BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr, ACC: tl.constexpr,
                   FP32_TERMS: tl.constexpr):
    """The fixed-point gather's first pass: each row's exponent e
    (fixed_point.row_exponent) from its entries' (_row_cells) largest
    |c| * g_q and their count n."""
    X = tl.full([BLOCK_S], NO_ENTRY, tl.int32)
    for j0 in range(0, tl.max(tl.reshape(n, [BLOCK_S]), axis=0), BLOCK_E):
        live, q, c = _entries(records_ptr, d0, d1, d2, d3, e0, e1, e2, n, j0, BLOCK_E, ACC)
        g = _query_max(gq_ptr, b, m, q, live, Q, ACC)
        X = tl.maximum(X, tl.max(entry_exponent(c, g, live), axis=1))
    if FP32_TERMS:
        return row_exponent(X, tl.reshape(n, [BLOCK_S]), TERM_BITS, SUM_BITS)
    else:
        return row_exponent(X, tl.reshape(n, [BLOCK_S]), FIXED_BITS, FIXED_BITS)


@triton.jit
def grad_value_gather_kernel(
    grad_out_ptr, shapes_ptr, bound_ptr, gq_ptr, lo_ptr, hi_ptr, records_ptr,
    grad_value_ptr, Q, S, CELLS, HEAD_STRIDE, CELL_STRIDE, D: tl.constexpr,
    stride_gob, stride_goq, stride_gom, stride_god,
    stride_gvb, stride_gvs, stride_gvm,
    L: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_D: tl.constexpr, ACC: tl.constexpr, FIXED: tl.constexpr, FP32_TERMS: tl.constexpr,
    PAIRS: tl.constexpr,
):
    """grad_value (B, S, M, D), unit channel stride, every row written: for
    each of BLOCK_S value rows, the terms of the samples in the four cells
    it is a corner of (_row_cells: bucket (head, cell) holds records lo[i]
    .. hi[i], i = head * HEAD_STRIDE + cell * CELL_STRIDE), BLOCK_E entries
    at a time: per entry its query and the one corner weight of the row's
    role times the query's grad_output row.

    FIXED (entries in an order that varies: bucket_fill_kernel's): two passes
    over each row's entries (fixed_point.py): the first takes the row's
    exponent from the largest |c| * g_q (gq_ptr: the queries' max_d
    |grad_output|, (B, Q, M), fp32 or for fp64 grad_output fp64) and the
    entries' count; the second sums the terms as integers, with FP32_TERMS
    (16-bit values, fp32 ACC) rounded in one FFMA each and summed in int32
    (exact_sums.py), else truncated from ACC and summed in int64
    (fixed_point_terms).  bound_ptr (B, M) float64: a head whose
    bound is not finite (inf or NaN in its grad_output or weights) makes
    its second pass a channel at a time, with its inf and NaN terms summed
    apart (_gather_channels, [BLOCK_S] sums a channel), after the tile's
    loop, which takes 0 steps in that head and whose store skips its rows;
    in the other heads the channel pass takes 0 channels.
    Not FIXED (entries in sample order: sorted_fill.py; bound_ptr and
    gq_ptr None): one pass, the terms summed in ACC in entry order; PAIRS
    (16-bit grad_output and grad_value as int32 words of two channels, as
    msda_fwd_pairs_kernel reads value: unit channel strides, even D and
    strides, Q * stride_goq < 2**31) reads each entry's grad_output row as
    words at an int32 offset and sums the even and the odd channels apart.
    Grid: (cdiv(S, BLOCK_S), M, B); program 0 takes the last rows, the
    coarsest level's, whose buckets are the fullest, so that the longest
    programs start first."""
    b, m, r, rmask, offs_d, dmask = program_tile(S, D, BLOCK_S, BLOCK_D)
    s = S - 1 - r
    lvl, H, W, start = _row_levels(s, shapes_ptr, L)
    # A level is empty of rows where shapes do not tile value (W < 1 or rows
    # past the last level): those rows get no entries, and no division by 0.
    W1 = tl.maximum(W, 1)
    y = (s - start) // W1
    x = (s - start) - y * W1
    row_ok = rmask & (W >= 1) & (y < H)
    head = b.to(tl.int64) * tl.num_programs(1) + m
    go_base = head_base(grad_out_ptr, b, m, stride_gob, stride_gom)
    dm = dmask[None, None, :]
    d0, d1, d2, d3, e0, e1, e2, n = _row_cells(lvl, y, x, W, row_ok, head, lo_ptr, hi_ptr,
                                               HEAD_STRIDE, CELL_STRIDE, shapes_ptr, CELLS, L)
    steps = tl.max(tl.reshape(n, [BLOCK_S]), axis=0)
    if FIXED:
        e = _row_exponents(gq_ptr, records_ptr, b, m, d0, d1, d2, d3, e0, e1, e2, n, Q,
                           BLOCK_S, BLOCK_E, ACC, FP32_TERMS)
        # A head with inf or NaN input takes _gather_channels (after the tile's loop),
        # the others the tile: loops of 0 steps and a store mask, not a branch, with
        # which ptxas gave the tile nearly twice its registers at D = 24.
        finite = head_finite(head_bound(bound_ptr, b, m)).to(tl.int32)
        steps *= finite
        acc = tl.zeros([BLOCK_S, BLOCK_D], dtype=tl.int32 if FP32_TERMS else tl.int64)
    elif PAIRS:
        # Words: a half in fp32 is one shift or and, an int32 offset one IMAD: the
        # sm_90 loop 294 instructions a step against 364, the bf16 encoder's gather 8% faster.
        HALF: tl.constexpr = grad_value_ptr.dtype.element_ty
        go_words = go_base.to(tl.pointer_type(tl.int32))
        offs_j = tl.arange(0, BLOCK_D // 2)
        jmask = offs_j < D // 2
        jm = jmask[None, None, :]
        acc_lo = tl.zeros([BLOCK_S, BLOCK_D // 2], dtype=tl.float32)
        acc_hi = tl.zeros([BLOCK_S, BLOCK_D // 2], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_S, BLOCK_D], dtype=ACC)
    for j0 in range(0, steps, BLOCK_E):
        live, q, c = _entries(records_ptr, d0, d1, d2, d3, e0, e1, e2, n, j0, BLOCK_E, ACC)
        if FIXED:
            g = _query_max(gq_ptr, b, m, q, live, Q, ACC)
        if PAIRS:
            raw = tl.load(go_words + (q.to(tl.int32) * (stride_goq // 2))[:, :, None]
                          + offs_j[None, None, :], mask=live[:, :, None] & jm, other=0)
            lo, hi = pair_halves(raw, HALF)
            acc_lo += tl.sum(c[:, :, None] * lo, axis=1)
            acc_hi += tl.sum(c[:, :, None] * hi, axis=1)
        else:
            go = tl.load(go_base + q[:, :, None] * stride_goq
                         + (offs_d * stride_god)[None, None, :],
                         mask=live[:, :, None] & dm, other=0.0).to(ACC)
            if not FIXED:
                acc += tl.sum(c[:, :, None] * go, axis=1)
            else:
                acc += tl.sum(_fixed_terms(c, g, go, e, FP32_TERMS), axis=1)
    gv_base = head_base(grad_value_ptr, b, m, stride_gvb, stride_gvm)
    if PAIRS:
        gv_words = gv_base.to(tl.pointer_type(tl.int32))
        tl.store(row_ptrs(gv_words, s, stride_gvs // 2, offs_j, 1),
                 pair_words(acc_lo, acc_hi, HALF), mask=rmask[:, None] & jmask[None, :])
    else:
        if FIXED:
            # The channel pass where the tile's sums only wait for their store: before
            # the tile's loop, ptxas spilled the fp32 tile at D = 64.
            _gather_channels(D * (1 - finite), gv_base, s, rmask, stride_gvs, go_base, gq_ptr,
                             records_ptr, b, m, d0, d1, d2, d3, e0, e1, e2, n, e, Q, stride_goq,
                             stride_god, BLOCK_S, BLOCK_E, ACC, FP32_TERMS)
            rmask &= finite != 0
            out = fixed_to_float(acc, e, grad_value_ptr.dtype.element_ty, ACC)
        else:
            out = acc.to(grad_value_ptr.dtype.element_ty)
        tl.store(row_ptrs(gv_base, s, stride_gvs, offs_d, 1), out,
                 mask=rmask[:, None] & dmask[None, :])
