"""The forward kernels of Multi-Scale Deformable Attention.

msda_fwd_kernel and msda_bwd_kernel (backward/kernels.py): one program owns
BLOCK_Q queries of one (batch, head) pair, all their sampling points (in
chunks of BLOCK_P) and the whole head dimension: a [BLOCK_Q, BLOCK_P,
BLOCK_D] tile.  (The forward of large fp16/bf16 grids is
msda_fwd_pairs_kernel, a [BLOCK_Q, BLOCK_D] tile looping over the points;
see there.)  Every sampled corner is a contiguous row of D values, so the
gathers (forward) and the scattered atomic adds (backward) are
row-vectorised along D, and the BLOCK_Q * BLOCK_P samples of a chunk are
independent, so all their loads are in flight at once (one point at a time,
each a location load followed by a dependent corner gather, left the
decoder forward latency-bound: docs/design.md).

Locations and weights are read in whatever float dtype they come in and all
arithmetic is in ACC (fp32, or fp64 when an input is fp64, which gradcheck
needs); only the stores round.

Offsets into value/grad_value/output are int64 so tensors past 2**31
elements work.  Level shapes and start offsets are read on the device: no
host synchronisation, so a launch is CUDA-graph capturable.
"""
import triton
import triton.language as tl

from ..jit_helpers import head_base, pair_halves, pair_words, program_tile, row_ptrs
from ..sampling import (
    bilinear_corners,
    corner_weights,
    load_corners,
    max_logit,
    point_exps,
    sample_chunk,
)


@triton.jit
def msda_fwd_kernel(
    value_ptr, shapes_ptr, loc_ptr, attn_ptr, out_ptr,
    Q, S, D: tl.constexpr,
    stride_vb, stride_vs, stride_vm, stride_vd,
    stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
    stride_ab, stride_aq, stride_am, stride_al, stride_ak,
    stride_ob, stride_oq, stride_om, stride_od,
    L: tl.constexpr, K: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr, ACC: tl.constexpr, SOFTMAX: tl.constexpr,
):
    """out[b, q, m, :] =
        sum_{l,k} attn[b,q,m,l,k] * bilinear(value[b, level l, m, :], loc[b,q,m,l,k]).

    value (B, S, M, D); loc (B, Q, M, L, K, 2); attn (B, Q, M, L, K);
    out (B, Q, M, D); shapes (L, 2) int (H, W): each level starts where
    the ones before it end (sampling.level_start).
    Grid: (cdiv(Q, BLOCK_Q), M, B).

    SOFTMAX: attn holds logits, and the weights are their softmax over the
    L * K points of each (query, head): a first pass over the logits finds
    each row's max, the samples are weighted by exp(logit - max), and the
    sum is divided by the sum of those exps (one exp per sample).
    """
    b, m, q, qmask, offs_d, dmask = program_tile(Q, D, BLOCK_Q, BLOCK_D)
    v_base = head_base(value_ptr, b, m, stride_vb, stride_vm)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], dtype=ACC)
    if SOFTMAX:
        row_max = max_logit(b, m, q, qmask, attn_ptr, stride_ab, stride_aq, stride_am,
                             stride_al, stride_ak, L, K, BLOCK_P, ACC)
        row_sum = tl.zeros_like(row_max)
    for p0 in range(0, L * K, BLOCK_P):
        w, lx, ly, i00, m00, m01, m10, m11, W, H, live, l, k, _, _ = sample_chunk(
            p0, b, m, q, qmask, shapes_ptr, loc_ptr, attn_ptr, S,
            stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
            stride_ab, stride_aq, stride_am, stride_al, stride_ak, L, K, BLOCK_P, ACC)
        if SOFTMAX:
            # Points past L * K and masked queries weigh exp(-inf) = 0.
            w = point_exps(w, live, row_max)
            row_sum += tl.sum(w, axis=1)
        v00, v01, v10, v11 = load_corners(v_base, i00, W, m00, m01, m10, m11, stride_vs,
                                           offs_d, stride_vd, dmask, ACC)
        c00, c01, c10, c11 = corner_weights(w, lx, ly)
        acc += tl.sum(c00 * v00 + c01 * v01 + c10 * v10 + c11 * v11, axis=1)
    if SOFTMAX:
        # A live row's sum is >= 1 (its max point weighs exp(0)); masked rows
        # are not stored.
        acc = acc * (1.0 / tl.where(qmask, row_sum, 1.0))[:, None]

    o_ptrs = row_ptrs(head_base(out_ptr, b, m, stride_ob, stride_om), q, stride_oq,
                       offs_d, stride_od)
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=qmask[:, None] & dmask[None, :])


@triton.jit
def _acc_pair_rows(acc_lo, acc_hi, ptrs, mask, c, HALF: tl.constexpr):
    """acc_lo/acc_hi [BLOCK_Q, BLOCK_D // 2] += c[:, None] * the even / odd
    channels of the rows at ``ptrs``, read as words of two HALF values
    (pair_halves; zeros where ``mask``, [BLOCK_Q, BLOCK_D // 2], is off)."""
    lo, hi = pair_halves(tl.load(ptrs, mask=mask, other=0), HALF)
    return acc_lo + c[:, None] * lo, acc_hi + c[:, None] * hi


@triton.jit
def msda_fwd_pairs_kernel(
    value_ptr, shapes_ptr, loc_ptr, attn_ptr, out_ptr,
    Q, S, D: tl.constexpr,
    stride_vb, stride_vs, stride_vm,
    stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
    stride_ab, stride_aq, stride_am, stride_al, stride_ak,
    stride_ob, stride_oq, stride_om,
    L: tl.constexpr, K: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
    SOFTMAX: tl.constexpr,
):
    """msda_fwd_kernel for fp16/bf16 values, another tiling: a program owns a
    [BLOCK_Q, BLOCK_D] tile of queries x channels and loops over the L * K
    points (unrolled), so the sum over points stays in each thread's
    registers: no shuffles and no shared-memory layout conversions.  Each
    thread redoes the bilinear set-up of its query's samples, which pays where
    value loads are cheap to convert: value and out are read and written as
    words of two channels, int32 for 16-bit values, int64 for fp32 (strides
    in elements, all even, D even, unit channel stride).  sm_90 SASS per
    sample: 19.5 instructions against msda_fwd_kernel's 25.8 (bf16) and 23.8
    (fp16).
    Grid: (cdiv(Q, BLOCK_Q), M, B).

    SOFTMAX as in msda_fwd_kernel, the max pass over one [BLOCK_Q, L * K]
    tile (sm_90, encoder call: 2672 SASS instructions against 2504 without
    SOFTMAX; unrolled over the points like the main loop, 2704).
    """
    HALF: tl.constexpr = out_ptr.dtype.element_ty
    b, m, q, qmask, offs_j, jmask = program_tile(Q, D // 2, BLOCK_Q, BLOCK_D // 2)
    jm = jmask[None, :]
    if HALF == tl.float32:
        words = tl.pointer_type(tl.int64)
    else:
        words = tl.pointer_type(tl.int32)
    v_base = head_base(value_ptr, b, m, stride_vb, stride_vm).to(words)
    row = stride_vs // 2
    loc_q = head_base(loc_ptr, b, m, stride_lb, stride_lm) + q.to(tl.int64) * stride_lq
    attn_q = head_base(attn_ptr, b, m, stride_ab, stride_am) + q.to(tl.int64) * stride_aq
    acc_lo = tl.zeros([BLOCK_Q, BLOCK_D // 2], dtype=tl.float32)
    acc_hi = tl.zeros([BLOCK_Q, BLOCK_D // 2], dtype=tl.float32)
    if SOFTMAX:
        row_max = max_logit(b, m, q, qmask, attn_ptr, stride_ab, stride_aq, stride_am,
                             stride_al, stride_ak, L, K, triton.next_power_of_2(L * K),
                             tl.float32)
        row_sum = tl.zeros([BLOCK_Q], dtype=tl.float32)
    start = tl.zeros([], dtype=tl.int32)  # level l's, summed level by level
    for l in tl.static_range(L):
        H = tl.load(shapes_ptr + 2 * l).to(tl.int32)
        W = tl.load(shapes_ptr + 2 * l + 1).to(tl.int32)
        for k in tl.static_range(K):
            lp = loc_q + l * stride_ll + k * stride_lk
            x = tl.load(lp, mask=qmask, other=0.0).to(tl.float32)
            y = tl.load(lp + stride_lc, mask=qmask, other=0.0).to(tl.float32)
            w = tl.load(attn_q + l * stride_al + k * stride_ak, mask=qmask,
                        other=0.0).to(tl.float32)
            if SOFTMAX:
                w = tl.exp(w - row_max)
                row_sum += w
            i00, m00, m01, m10, m11, lx, ly = bilinear_corners(x, y, H, W, start, S, qmask)
            p00 = row_ptrs(v_base, i00, row, offs_j, 1)
            p10 = p00 + W.to(tl.int64) * row
            hx = 1.0 - lx
            hy = 1.0 - ly
            # One corner at a time into the accumulators: a 16-bit version of
            # this loop that summed the four products first took 186
            # registers instead of 80 (bf16, sm_90).
            acc_lo, acc_hi = _acc_pair_rows(acc_lo, acc_hi, p00, m00[:, None] & jm,
                                            w * hy * hx, HALF)
            acc_lo, acc_hi = _acc_pair_rows(acc_lo, acc_hi, p00 + row, m01[:, None] & jm,
                                            w * hy * lx, HALF)
            acc_lo, acc_hi = _acc_pair_rows(acc_lo, acc_hi, p10, m10[:, None] & jm,
                                            w * ly * hx, HALF)
            acc_lo, acc_hi = _acc_pair_rows(acc_lo, acc_hi, p10 + row, m11[:, None] & jm,
                                            w * ly * lx, HALF)
        start += H * W

    if SOFTMAX:
        inv_sum = (1.0 / row_sum)[:, None]
        acc_lo *= inv_sum
        acc_hi *= inv_sum
    o_base = head_base(out_ptr, b, m, stride_ob, stride_om).to(words)
    tl.store(row_ptrs(o_base, q, stride_oq // 2, offs_j, 1), pair_words(acc_lo, acc_hi, HALF),
             mask=qmask[:, None] & jm)
