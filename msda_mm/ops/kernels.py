"""Triton kernels for Multi-Scale Deformable Attention.

msda_fwd_kernel and msda_bwd_kernel: one program owns BLOCK_Q queries of one
(batch, head) pair, all their sampling points (in chunks of BLOCK_P) and the
whole head dimension: a [BLOCK_Q, BLOCK_P, BLOCK_D] tile.  (The forward of
large fp16/bf16 grids is msda_fwd_pairs_kernel, a [BLOCK_Q, BLOCK_D] tile
looping over the points; see there.)  Every sampled corner is a contiguous row
of D values, so the gathers (forward) and the scattered atomic adds
(backward) are row-vectorised along D, and the BLOCK_Q * BLOCK_P samples of
a chunk are independent, so all their loads are in flight at once.  (The
first version looped over the L * K points one at a time, each a
location load followed by a dependent corner gather: on the H200 the
decoder forward was latency-bound at 22 us; docs/design.md.)

Locations and weights are read in whatever float dtype they come in and all
arithmetic is in ACC (fp32, or fp64 when an input is fp64, which gradcheck
needs); only the stores round.

Deterministic backward: msda_bwd_kernel without grad_value (grad_loc and
grad_attn as in the default backward, bitwise), then the samples sorted by
cell and a gather per value row (bucket_kernels.py), no atomic on
grad_value.  Rows of 2 entries or more: a stable sort (sorted_buckets.py),
the terms summed in float in sample order.  Sparser rows: a counting sort
whose ranks msda_bwd_kernel takes, the terms summed as integers: integer
addition is associative, so the order of the samples no longer matters.  Each
row's terms c * go are scaled by 2**e, a power of two the gather takes from a
first pass over the row's entries (its largest |c| * max_d |go|, a max),
rounded to integers and summed in int64 registers (fp32, fp64 values) or
int32 (fp16, bf16: terms rounded in one FFMA), with no sum past the
register's range; each sum is scaled back by 2**-e and rounded once
(fixed_point.py, exact_sums.py).

Offsets into value/grad_value/output are int64 so tensors past 2**31
elements work.  Level shapes and start offsets are read on the device: no
host synchronisation, so a launch is CUDA-graph capturable.

Sampling follows ``F.grid_sample(align_corners=False, padding_mode='zeros')``:
pixel coordinate ``x * W - 0.5``, corners outside the level read as zero.
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .cells import _cell, _key_samples, _rank_samples


@triton.jit
def _bilinear_corners(x, y, H, W, start, S, active):
    """Corner indices, masks and bilinear fractions of a [BLOCK_Q, BLOCK_P]
    tile of normalised (x, y) locations; H, W, start are each point's level
    (int32).  A sample that is not live (_cell) has no live corner and
    contributes (and receives) exactly zero.
    """
    ok, x0, y0, lx, ly = _cell(x, y, H, W, active)
    # With ok, -1 <= x0 <= W-1, so only x0 >= 0 and x0 + 1 < W can fail.
    mx0 = x0 >= 0
    mx1 = x0 + 1 < W
    my0 = ok & (y0 >= 0)
    my1 = ok & (y0 + 1 < H)
    # Indices are int32 (S < 2**31, checked by the launcher): 2% (bf16
    # forward) to 6% (backward) fewer SASS instructions than int64.  Shapes
    # that agree with value's S keep every live corner inside its level;
    # shapes that do not (CUDA shapes, which the host cannot read without a
    # sync) may wrap, so each corner must also lie in [0, S): one unsigned
    # comparison, and never an access out of bounds.
    i00 = start + y0 * W + x0
    i10 = i00 + W
    m00 = my0 & mx0 & (i00.to(tl.uint32, bitcast=True) < S)
    m01 = my0 & mx1 & ((i00 + 1).to(tl.uint32, bitcast=True) < S)
    m10 = my1 & mx0 & (i10.to(tl.uint32, bitcast=True) < S)
    m11 = my1 & mx1 & ((i10 + 1).to(tl.uint32, bitcast=True) < S)
    return i00, m00, m01, m10, m11, lx, ly


@triton.jit
def _row_ptrs(base, idx, stride_s, offs_d, stride_d):
    """[BLOCK_Q, BLOCK_D] pointers to rows idx (a [BLOCK_Q] vector)."""
    return base + idx.to(tl.int64)[:, None] * stride_s + (offs_d * stride_d)[None, :]


@triton.jit
def _corner_ptrs(base, idx, stride_s, offs_d, stride_d):
    """[BLOCK_Q, BLOCK_P, BLOCK_D] pointers to rows idx (a [BLOCK_Q, BLOCK_P] tile)."""
    return base + idx.to(tl.int64)[:, :, None] * stride_s + (offs_d * stride_d)[None, None, :]


@triton.jit
def _head_base(ptr, b, m, stride_b, stride_m):
    return ptr + b.to(tl.int64) * stride_b + m.to(tl.int64) * stride_m


@triton.jit
def _point_ptrs(ptr, b, q, m, l, k, stride_b, stride_q, stride_m, stride_l, stride_k):
    """[BLOCK_Q, BLOCK_P] pointers to element (b, q, m, l, k) of a
    (B, Q, M, L, K, ...) tensor."""
    return (_head_base(ptr, b, m, stride_b, stride_m) + q.to(tl.int64)[:, None] * stride_q
            + (l * stride_l + k * stride_k)[None, :])


@triton.jit
def _program_queries(Q, BLOCK_Q: tl.constexpr):
    """This program's batch b, head m and [BLOCK_Q] queries with their mask
    (grid: query blocks, M, B)."""
    q = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    return tl.program_id(2), tl.program_id(1), q, q < Q


@triton.jit
def _program_tile(Q, D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's batch b, head m, [BLOCK_Q] queries and [BLOCK_D] head
    channels, with their bounds masks.  Grid (query blocks, M, B): query
    blocks vary fastest, so that neighbouring programs sample neighbouring
    rows of the same head, and no program divides its id (a flat grid cost
    4 integer divisions, ~50 of 904 SASS instructions of the bf16 forward)."""
    b, m, q, qmask = _program_queries(Q, BLOCK_Q)
    offs_d = tl.arange(0, BLOCK_D)
    return b, m, q, qmask, offs_d, offs_d < D


@triton.jit
def _chunk_points(p0, L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr):
    """Points p0 .. p0 + BLOCK_P of the flattened (L, K) axis: their level l,
    point k and bounds mask ([BLOCK_P] each)."""
    p = p0 + tl.arange(0, BLOCK_P)
    pmask = p < L * K
    return tl.where(pmask, p // K, 0), p % K, pmask


@triton.jit
def _point_chunk(p0, shapes_ptr, starts_ptr, L: tl.constexpr, K: tl.constexpr,
                 BLOCK_P: tl.constexpr):
    """_chunk_points and the points' level geometry H, W, start ([BLOCK_P]
    each, int32)."""
    l, k, pmask = _chunk_points(p0, L, K, BLOCK_P)
    H = tl.load(shapes_ptr + 2 * l).to(tl.int32)
    W = tl.load(shapes_ptr + 2 * l + 1).to(tl.int32)
    start = tl.load(starts_ptr + l).to(tl.int32)
    return l, k, pmask, H[None, :], W[None, :], start[None, :]


@triton.jit
def _corner_rows(base, i00, W, stride_s, offs_d, stride_d):
    """[BLOCK_Q, BLOCK_P, BLOCK_D] pointers to the top-left (00) and
    bottom-left (10) corner rows of each sample; the right corners are one
    stride_s further."""
    p00 = _corner_ptrs(base, i00, stride_s, offs_d, stride_d)
    return p00, p00 + W.to(tl.int64)[:, :, None] * stride_s


@triton.jit
def _bilinear_weights(w, lx, ly):
    """The four bilinear weights times the attention weight (00, 01, 10, 11),
    each in lx's shape: one expression for every kernel, so that the
    deterministic gather's terms are bitwise the backward's."""
    hx = 1.0 - lx
    hy = 1.0 - ly
    return w * hy * hx, w * hy * lx, w * ly * hx, w * ly * lx


@triton.jit
def _bilinear_weight(w, lx, ly, bottom, right):
    """The one of _bilinear_weights' four of corner (bottom, right) (masks),
    by the same fp operations: bitwise the same weight."""
    return w * tl.where(bottom, ly, 1.0 - ly) * tl.where(right, lx, 1.0 - lx)


@triton.jit
def _corner_weights(w, lx, ly):
    """_bilinear_weights as [BLOCK_Q, BLOCK_P, 1] tiles."""
    c00, c01, c10, c11 = _bilinear_weights(w, lx, ly)
    return c00[:, :, None], c01[:, :, None], c10[:, :, None], c11[:, :, None]


@triton.jit
def _load_corners(v_base, i00, W, m00, m01, m10, m11, stride_vs, offs_d, stride_vd, dmask,
                  ACC: tl.constexpr):
    """The four [BLOCK_Q, BLOCK_P, BLOCK_D] corner rows around each sample
    (zeros where a corner is outside its level)."""
    p00, p10 = _corner_rows(v_base, i00, W, stride_vs, offs_d, stride_vd)
    dm = dmask[None, None, :]
    v00 = tl.load(p00, mask=m00[:, :, None] & dm, other=0.0).to(ACC)
    v01 = tl.load(p00 + stride_vs, mask=m01[:, :, None] & dm, other=0.0).to(ACC)
    v10 = tl.load(p10, mask=m10[:, :, None] & dm, other=0.0).to(ACC)
    v11 = tl.load(p10 + stride_vs, mask=m11[:, :, None] & dm, other=0.0).to(ACC)
    return v00, v01, v10, v11


@triton.jit
def _sample_chunk(p0, b, m, q, qmask, shapes_ptr, starts_ptr, loc_ptr, attn_ptr, S,
                  stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
                  stride_ab, stride_aq, stride_am, stride_al, stride_ak,
                  L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr, ACC: tl.constexpr):
    """Everything about one chunk of points of this program's queries, as
    [BLOCK_Q, BLOCK_P] tiles: weight w, bilinear fractions lx, ly, corner
    00 index, the four corner masks, the level width W and height H, the
    live-sample mask, the (l, k) offsets for the per-point outputs and the
    locations x, y."""
    l, k, pmask, H, W, start = _point_chunk(p0, shapes_ptr, starts_ptr, L, K, BLOCK_P)
    live = qmask[:, None] & pmask[None, :]
    lp = _point_ptrs(loc_ptr, b, q, m, l, k, stride_lb, stride_lq, stride_lm, stride_ll,
                     stride_lk)
    x = tl.load(lp, mask=live, other=0.0).to(ACC)
    y = tl.load(lp + stride_lc, mask=live, other=0.0).to(ACC)
    w = tl.load(_point_ptrs(attn_ptr, b, q, m, l, k, stride_ab, stride_aq, stride_am,
                            stride_al, stride_ak), mask=live, other=0.0).to(ACC)
    i00, m00, m01, m10, m11, lx, ly = _bilinear_corners(x, y, H, W, start, S, live)
    return w, lx, ly, i00, m00, m01, m10, m11, W, H, live, l, k, x, y


@triton.jit
def _chunk_logits(p0, b, m, q, qmask, attn_ptr, stride_ab, stride_aq, stride_am, stride_al,
                  stride_ak, L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr,
                  ACC: tl.constexpr):
    """[BLOCK_Q, BLOCK_P] logits of points p0 .. p0 + BLOCK_P (-inf where not
    live), the live mask and the (l, k) offsets."""
    l, k, pmask = _chunk_points(p0, L, K, BLOCK_P)
    live = qmask[:, None] & pmask[None, :]
    logits = tl.load(_point_ptrs(attn_ptr, b, q, m, l, k, stride_ab, stride_aq, stride_am,
                                 stride_al, stride_ak), mask=live, other=float("-inf"))
    return logits.to(ACC), live, l, k


@triton.jit
def _max_logit(b, m, q, qmask, attn_ptr, stride_ab, stride_aq, stride_am, stride_al,
               stride_ak, L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr,
               ACC: tl.constexpr):
    """[BLOCK_Q] largest of the L * K attention logits of each query, read in
    chunks of BLOCK_P points; 0 for masked queries, so their exps stay finite."""
    row_max = tl.full(q.shape, float("-inf"), ACC)
    for p0 in range(0, L * K, BLOCK_P):
        logits, _, _, _ = _chunk_logits(p0, b, m, q, qmask, attn_ptr, stride_ab, stride_aq,
                                        stride_am, stride_al, stride_ak, L, K, BLOCK_P, ACC)
        row_max = tl.maximum(row_max, tl.max(logits, axis=1))
    return tl.where(qmask, row_max, 0.0)


@triton.jit
def _point_exps(logits, live, row_max):
    """exp(logit - row max) of a [BLOCK_Q, BLOCK_P] tile: the unnormalised
    softmax weights, 0 (exp(-inf)) at points past L * K and masked queries."""
    return tl.exp(tl.where(live, logits - row_max[:, None], float("-inf")))


@triton.jit
def _softmax_stats(b, m, q, qmask, attn_ptr, stride_ab, stride_aq, stride_am, stride_al,
                   stride_ak, L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr,
                   ACC: tl.constexpr):
    """[BLOCK_Q] row max and 1 / sum of exps of each query's L * K logits:
    two passes over them, so that the backward's main loop gets the softmax
    weights themselves.  Masked queries get 1 / 1 (they are never stored)."""
    row_max = _max_logit(b, m, q, qmask, attn_ptr, stride_ab, stride_aq, stride_am, stride_al,
                         stride_ak, L, K, BLOCK_P, ACC)
    row_sum = tl.zeros_like(row_max)
    for p0 in range(0, L * K, BLOCK_P):
        logits, live, _, _ = _chunk_logits(p0, b, m, q, qmask, attn_ptr, stride_ab, stride_aq,
                                           stride_am, stride_al, stride_ak, L, K, BLOCK_P, ACC)
        row_sum += tl.sum(_point_exps(logits, live, row_max), axis=1)
    return row_max, 1.0 / tl.where(qmask, row_sum, 1.0)


@triton.jit
def msda_fwd_kernel(
    value_ptr, shapes_ptr, starts_ptr, loc_ptr, attn_ptr, out_ptr,
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
    out (B, Q, M, D); shapes (L, 2) int (H, W); starts (L,) int.
    Grid: (cdiv(Q, BLOCK_Q), M, B).

    SOFTMAX: attn holds logits, and the weights are their softmax over the
    L * K points of each (query, head): a first pass over the logits finds
    each row's max, the samples are weighted by exp(logit - max), and the
    sum is divided by the sum of those exps (one exp per sample).
    """
    b, m, q, qmask, offs_d, dmask = _program_tile(Q, D, BLOCK_Q, BLOCK_D)
    v_base = _head_base(value_ptr, b, m, stride_vb, stride_vm)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], dtype=ACC)
    if SOFTMAX:
        row_max = _max_logit(b, m, q, qmask, attn_ptr, stride_ab, stride_aq, stride_am,
                             stride_al, stride_ak, L, K, BLOCK_P, ACC)
        row_sum = tl.zeros_like(row_max)
    for p0 in range(0, L * K, BLOCK_P):
        w, lx, ly, i00, m00, m01, m10, m11, W, H, live, l, k, _, _ = _sample_chunk(
            p0, b, m, q, qmask, shapes_ptr, starts_ptr, loc_ptr, attn_ptr, S,
            stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
            stride_ab, stride_aq, stride_am, stride_al, stride_ak, L, K, BLOCK_P, ACC)
        if SOFTMAX:
            # Points past L * K and masked queries weigh exp(-inf) = 0.
            w = _point_exps(w, live, row_max)
            row_sum += tl.sum(w, axis=1)
        v00, v01, v10, v11 = _load_corners(v_base, i00, W, m00, m01, m10, m11, stride_vs,
                                           offs_d, stride_vd, dmask, ACC)
        c00, c01, c10, c11 = _corner_weights(w, lx, ly)
        acc += tl.sum(c00 * v00 + c01 * v01 + c10 * v10 + c11 * v11, axis=1)
    if SOFTMAX:
        # A live row's sum is >= 1 (its max point weighs exp(0)); masked rows
        # are not stored.
        acc = acc * (1.0 / tl.where(qmask, row_sum, 1.0))[:, None]

    o_ptrs = _row_ptrs(_head_base(out_ptr, b, m, stride_ob, stride_om), q, stride_oq,
                       offs_d, stride_od)
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=qmask[:, None] & dmask[None, :])


@triton.jit
def _pair_halves(raw, HALF: tl.constexpr):
    """int32 words of two HALF values: the low and the high ones, in fp32."""
    if HALF == tl.bfloat16:
        # A bf16 is the high half of an fp32: one shift or one and per value,
        # where a bf16 -> fp32 conversion took 1.5 instructions on sm_90.
        lo = (raw << 16).to(tl.float32, bitcast=True)
        hi = (raw & -65536).to(tl.float32, bitcast=True)
    else:
        lo = raw.to(tl.int16).to(HALF, bitcast=True).to(tl.float32)
        hi = (raw >> 16).to(tl.int16).to(HALF, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _pair_words(lo, hi, HALF: tl.constexpr):
    """_pair_halves' inverse: fp32 lo and hi rounded to HALF, as int32 words."""
    return ((lo.to(HALF).to(tl.int16, bitcast=True).to(tl.int32) & 65535)
            | (hi.to(HALF).to(tl.int16, bitcast=True).to(tl.int32) << 16))


@triton.jit
def _acc_pair_rows(acc_lo, acc_hi, ptrs, mask, c, HALF: tl.constexpr):
    """acc_lo/acc_hi [BLOCK_Q, BLOCK_D // 2] += c[:, None] * the even / odd
    channels of the rows at ``ptrs``, read as int32 words of two HALF values
    (zeros where ``mask``, [BLOCK_Q, BLOCK_D // 2], is off)."""
    lo, hi = _pair_halves(tl.load(ptrs, mask=mask, other=0), HALF)
    return acc_lo + c[:, None] * lo, acc_hi + c[:, None] * hi


@triton.jit
def msda_fwd_pairs_kernel(
    value_ptr, shapes_ptr, starts_ptr, loc_ptr, attn_ptr, out_ptr,
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
    int32 words of two 16-bit channels (strides in 16-bit elements, all even,
    D even, unit channel stride).  sm_90 SASS per sample: 19.5 instructions
    against msda_fwd_kernel's 25.8 (bf16) and 23.8 (fp16).
    Grid: (cdiv(Q, BLOCK_Q), M, B).

    SOFTMAX as in msda_fwd_kernel, the max pass over one [BLOCK_Q, L * K]
    tile (sm_90, encoder call: 2672 SASS instructions against 2504 without
    SOFTMAX; unrolled over the points like the main loop, 2704).
    """
    HALF: tl.constexpr = out_ptr.dtype.element_ty
    b, m, q, qmask, offs_j, jmask = _program_tile(Q, D // 2, BLOCK_Q, BLOCK_D // 2)
    jm = jmask[None, :]
    words = tl.pointer_type(tl.int32)
    v_base = _head_base(value_ptr, b, m, stride_vb, stride_vm).to(words)
    row = stride_vs // 2
    loc_q = _head_base(loc_ptr, b, m, stride_lb, stride_lm) + q.to(tl.int64) * stride_lq
    attn_q = _head_base(attn_ptr, b, m, stride_ab, stride_am) + q.to(tl.int64) * stride_aq
    acc_lo = tl.zeros([BLOCK_Q, BLOCK_D // 2], dtype=tl.float32)
    acc_hi = tl.zeros([BLOCK_Q, BLOCK_D // 2], dtype=tl.float32)
    if SOFTMAX:
        row_max = _max_logit(b, m, q, qmask, attn_ptr, stride_ab, stride_aq, stride_am,
                             stride_al, stride_ak, L, K, triton.next_power_of_2(L * K),
                             tl.float32)
        row_sum = tl.zeros([BLOCK_Q], dtype=tl.float32)
    for l in tl.static_range(L):
        H = tl.load(shapes_ptr + 2 * l).to(tl.int32)
        W = tl.load(shapes_ptr + 2 * l + 1).to(tl.int32)
        start = tl.load(starts_ptr + l).to(tl.int32)
        for k in tl.static_range(K):
            lp = loc_q + l * stride_ll + k * stride_lk
            x = tl.load(lp, mask=qmask, other=0.0).to(tl.float32)
            y = tl.load(lp + stride_lc, mask=qmask, other=0.0).to(tl.float32)
            w = tl.load(attn_q + l * stride_al + k * stride_ak, mask=qmask,
                        other=0.0).to(tl.float32)
            if SOFTMAX:
                w = tl.exp(w - row_max)
                row_sum += w
            i00, m00, m01, m10, m11, lx, ly = _bilinear_corners(x, y, H, W, start, S, qmask)
            p00 = _row_ptrs(v_base, i00, row, offs_j, 1)
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

    if SOFTMAX:
        inv_sum = (1.0 / row_sum)[:, None]
        acc_lo *= inv_sum
        acc_hi *= inv_sum
    o_base = _head_base(out_ptr, b, m, stride_ob, stride_om).to(words)
    tl.store(_row_ptrs(o_base, q, stride_oq // 2, offs_j, 1), _pair_words(acc_lo, acc_hi, HALF),
             mask=qmask[:, None] & jm)


@triton.jit
def _point_softmax(logits, live, row_max, inv_sum):
    """The softmax weights p of a [BLOCK_Q, BLOCK_P] tile of logits, from
    _softmax_stats' row max and 1 / sum (0 where not live)."""
    return _point_exps(logits, live, row_max) * inv_sum[:, None]


@triton.jit
def _softmax_backward(b, m, q, qmask, attn_ptr, grad_attn_ptr, grad_logit_ptr, row_max, inv_sum,
                      dot, stride_ab, stride_aq, stride_am, stride_al, stride_ak,
                      stride_gab, stride_gaq, stride_gam, stride_gal, stride_gak,
                      L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr,
                      ACC: tl.constexpr):
    """grad_logit = p * (g - dot) at this program's live points, where g is
    the gradient for the softmax weights p that the main loop stored in
    grad_attn, dot each row's sum of p * g, and p is recomputed from the
    logits.  grad_logit has grad_attn's strides and may be grad_attn itself."""
    # Other threads of the CTA stored the g of these points: make them visible.
    tl.debug_barrier()
    for p0 in range(0, L * K, BLOCK_P):
        logits, live, l, k = _chunk_logits(p0, b, m, q, qmask, attn_ptr, stride_ab, stride_aq,
                                           stride_am, stride_al, stride_ak, L, K, BLOCK_P, ACC)
        p = _point_softmax(logits, live, row_max, inv_sum)
        g = tl.load(_point_ptrs(grad_attn_ptr, b, q, m, l, k, stride_gab, stride_gaq,
                                stride_gam, stride_gal, stride_gak), mask=live, other=0.0)
        # In place, every thread holding a copy of an element (tiles narrower
        # than the CTA replicate it, across warps too) reads g before any writes.
        tl.debug_barrier()
        tl.store(_point_ptrs(grad_logit_ptr, b, q, m, l, k, stride_gab, stride_gaq, stride_gam,
                             stride_gal, stride_gak),
                 (p * (g.to(ACC) - dot[:, None])).to(grad_logit_ptr.dtype.element_ty), mask=live)


@triton.jit
def msda_bwd_kernel(
    grad_out_ptr, value_ptr, shapes_ptr, starts_ptr, loc_ptr, attn_ptr,
    grad_value_ptr, grad_loc_ptr, grad_attn_ptr, grad_logit_ptr, ranks_ptr, counts_ptr,
    keys_ptr, records_ptr, CELLS, KEY_BIAS, Q, S, D: tl.constexpr,
    stride_gob, stride_goq, stride_gom, stride_god,
    stride_vb, stride_vs, stride_vm, stride_vd,
    stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
    stride_ab, stride_aq, stride_am, stride_al, stride_ak,
    stride_gvb, stride_gvs, stride_gvm,
    stride_glb, stride_glq, stride_glm, stride_gll, stride_glk, stride_glc,
    stride_gab, stride_gaq, stride_gam, stride_gal, stride_gak,
    L: tl.constexpr, K: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr, ACC: tl.constexpr, PDL: tl.constexpr, SOFTMAX: tl.constexpr,
):
    """All three gradients of msda_fwd_kernel, same tiling and grid.

    grad_out (B, Q, M, D); grad_value (B, S, M, D), zero-filled, contiguous
    along D, accumulated with relaxed atomics (its dtype decides the atomic:
    value's own, or fp32 scratch); grad_loc (B, Q, M, L, K, 2) and
    grad_attn (B, Q, M, L, K) are written once per element.

    grad_value_ptr None (a constexpr): grad_loc and grad_attn only, no
    atomics on grad_value (the deterministic backward, whose grad_value is
    grad_value_gather_kernel's).  counts_ptr not None (a constexpr, with
    ranks_ptr and CELLS; None in the other backwards): also the counting
    sort's ranks of the samples in their buckets (cells._rank_samples).
    keys_ptr not None (with records_ptr, CELLS and KEY_BIAS): also the stable
    sort's keys and records of the samples (cells._key_samples).

    PDL (sm_90+, launched with launch_pdl right after grad_value's fill:
    zero_fill_kernel, or PyTorch's fill for fp32): the gathers and the
    grad_loc / grad_attn stores may run while grad_value is still being
    zeroed; the atomics wait for the fill.

    SOFTMAX: attn holds logits, as in msda_fwd_kernel.
    Two passes over the logits give each row's max and sum of exps, so that
    the main loop weighs the samples by the softmax weights p; grad_attn
    (fp32 or fp64) receives the gradient g for p, and a last pass writes the
    logits' gradient p * (g - sum(p * g)) to grad_logit_ptr (B, Q, M, L, K).
    """
    b, m, q, qmask, offs_d, dmask = _program_tile(Q, D, BLOCK_Q, BLOCK_D)
    dm = dmask[None, None, :]
    go_ptrs = _row_ptrs(_head_base(grad_out_ptr, b, m, stride_gob, stride_gom), q,
                        stride_goq, offs_d, stride_god)
    go = tl.load(go_ptrs, mask=qmask[:, None] & dmask[None, :], other=0.0).to(ACC)[:, None, :]

    v_base = _head_base(value_ptr, b, m, stride_vb, stride_vm)
    if SOFTMAX:
        row_max, inv_sum = _softmax_stats(b, m, q, qmask, attn_ptr, stride_ab, stride_aq,
                                          stride_am, stride_al, stride_ak, L, K, BLOCK_P, ACC)
        dot = tl.zeros_like(row_max)
    for p0 in range(0, L * K, BLOCK_P):
        w, lx, ly, i00, m00, m01, m10, m11, W, H, live, l, k, x, y = _sample_chunk(
            p0, b, m, q, qmask, shapes_ptr, starts_ptr, loc_ptr, attn_ptr, S,
            stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
            stride_ab, stride_aq, stride_am, stride_al, stride_ak, L, K, BLOCK_P, ACC)
        if counts_ptr is not None:
            # The counting sort's ranks, from this chunk's locations (its cells
            # are _bilinear_corners', computed once).
            _rank_samples(x, y, l, H, W, live, p0, b, m, q, Q, CELLS, shapes_ptr, ranks_ptr,
                          counts_ptr, L, K, BLOCK_P)
        if keys_ptr is not None:
            # The stable sort's keys and records, where the locations and weights are read.
            _key_samples(x, y, l, H, W, live, w, p0, b, m, q, Q, CELLS, KEY_BIAS, shapes_ptr,
                         keys_ptr, records_ptr, L, K, BLOCK_P)
        if SOFTMAX:
            w = _point_softmax(w, live, row_max, inv_sum)
        v00, v01, v10, v11 = _load_corners(v_base, i00, W, m00, m01, m10, m11, stride_vs,
                                           offs_d, stride_vd, dmask, ACC)
        # s_c = <grad_out, corner row c>: everything the location and
        # weight gradients need from the value.
        s00 = tl.sum(go * v00, axis=2)
        s01 = tl.sum(go * v01, axis=2)
        s10 = tl.sum(go * v10, axis=2)
        s11 = tl.sum(go * v11, axis=2)
        hx = 1.0 - lx
        hy = 1.0 - ly
        g_attn = hy * (hx * s00 + lx * s01) + ly * (hx * s10 + lx * s11)
        g_x = w * W * (hy * (s01 - s00) + ly * (s11 - s10))
        g_y = w * H * (hx * (s10 - s00) + lx * (s11 - s01))
        if SOFTMAX:
            dot += tl.sum(w * g_attn, axis=1)
        glp = _point_ptrs(grad_loc_ptr, b, q, m, l, k, stride_glb, stride_glq, stride_glm,
                          stride_gll, stride_glk)
        tl.store(glp, g_x.to(grad_loc_ptr.dtype.element_ty), mask=live)
        tl.store(glp + stride_glc, g_y.to(grad_loc_ptr.dtype.element_ty), mask=live)
        tl.store(_point_ptrs(grad_attn_ptr, b, q, m, l, k, stride_gab, stride_gaq, stride_gam,
                             stride_gal, stride_gak),
                 g_attn.to(grad_attn_ptr.dtype.element_ty), mask=live)

        if grad_value_ptr is not None:
            gv_ty = grad_value_ptr.dtype.element_ty
            gv_base = _head_base(grad_value_ptr, b, m, stride_gvb, stride_gvm)
            c00, c01, c10, c11 = _corner_weights(w, lx, ly)
            g00, g10 = _corner_rows(gv_base, i00, W, stride_gvs, offs_d, 1)
            if PDL:
                # grad_value's zeros (the kernel before this one) must be in place.
                gdc_wait()
            tl.atomic_add(g00, (c00 * go).to(gv_ty),
                          mask=m00[:, :, None] & dm, sem="relaxed")
            tl.atomic_add(g00 + stride_gvs, (c01 * go).to(gv_ty),
                          mask=m01[:, :, None] & dm, sem="relaxed")
            tl.atomic_add(g10, (c10 * go).to(gv_ty),
                          mask=m10[:, :, None] & dm, sem="relaxed")
            tl.atomic_add(g10 + stride_gvs, (c11 * go).to(gv_ty),
                          mask=m11[:, :, None] & dm, sem="relaxed")
    if SOFTMAX:
        _softmax_backward(b, m, q, qmask, attn_ptr, grad_attn_ptr, grad_logit_ptr, row_max,
                          inv_sum, dot, stride_ab, stride_aq, stride_am, stride_al, stride_ak,
                          stride_gab, stride_gaq, stride_gam, stride_gal, stride_gak,
                          L, K, BLOCK_P, ACC)


@triton.jit
def zero_fill_kernel(ptr, N, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """ptr[0:N] = 0: a grid-stride loop over BLOCK-element blocks, so that a
    grid of a few programs per SM is resident at once.

    PDL: let the next kernel launch (msda_bwd_kernel with PDL) before the
    first store; that kernel's gdc_wait still waits for this whole grid.
    """
    if PDL:
        gdc_launch_dependents()
    offs = tl.arange(0, BLOCK)
    zeros = tl.zeros([BLOCK], dtype=ptr.dtype.element_ty)
    for start in range(tl.program_id(0).to(tl.int64) * BLOCK, N, tl.num_programs(0) * BLOCK):
        tl.store(ptr + start + offs, zeros, mask=start + offs < N)
