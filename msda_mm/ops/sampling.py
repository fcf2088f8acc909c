"""The @triton.jit helpers that sample a chunk of points, shared by the
forward kernels, msda_bwd_kernel and the deterministic backward: each
location's cell and bilinear corners, the corner rows and their weights,
and the softmax weights of attention logits.

Sampling follows ``F.grid_sample(align_corners=False, padding_mode='zeros')``:
pixel coordinate ``x * W - 0.5``, corners outside the level read as zero.
"""
import triton
import triton.language as tl

from .jit_helpers import chunk_points, point_ptrs


@triton.jit
def sample_cell(x, y, H, W, active):
    """Whether each normalised (x, y) location is a live sample (inside the
    level's extended grid: x_im in [-1, W), y_im in [-1, H)), the top-left
    corner (x0, y0) of its cell (int32, in [-1, W-1] x [-1, H-1]) and its
    bilinear fractions lx, ly; zeros where not live.

    NaN fails every comparison and +-inf fails one, so a non-finite location
    is never live.
    """
    x_im = x * W - 0.5
    y_im = y * H - 0.5
    ok = active & (x_im >= -1.0) & (x_im < W) & (y_im >= -1.0) & (y_im < H)
    x_im = tl.where(ok, x_im, 0.0)
    y_im = tl.where(ok, y_im, 0.0)
    x0f = tl.floor(x_im)
    y0f = tl.floor(y_im)
    return ok, x0f.to(tl.int32), y0f.to(tl.int32), x_im - x0f, y_im - y0f


@triton.jit
def bilinear_corners(x, y, H, W, start, S, active):
    """Corner indices, masks and bilinear fractions of a [BLOCK_Q, BLOCK_P]
    tile of normalised (x, y) locations; H, W, start are each point's level
    (int32).  A sample that is not live (sample_cell) has no live corner and
    contributes (and receives) exactly zero.
    """
    ok, x0, y0, lx, ly = sample_cell(x, y, H, W, active)
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
def _corner_ptrs(base, idx, stride_s, offs_d, stride_d):
    """[BLOCK_Q, BLOCK_P, BLOCK_D] pointers to rows idx (a [BLOCK_Q, BLOCK_P] tile)."""
    return base + idx.to(tl.int64)[:, :, None] * stride_s + (offs_d * stride_d)[None, None, :]


@triton.jit
def corner_rows(base, i00, W, stride_s, offs_d, stride_d):
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
def bilinear_weight(w, lx, ly, bottom, right):
    """The one of _bilinear_weights' four of corner (bottom, right) (masks),
    by the same fp operations: bitwise the same weight."""
    return w * tl.where(bottom, ly, 1.0 - ly) * tl.where(right, lx, 1.0 - lx)


@triton.jit
def corner_weights(w, lx, ly):
    """_bilinear_weights as [BLOCK_Q, BLOCK_P, 1] tiles."""
    c00, c01, c10, c11 = _bilinear_weights(w, lx, ly)
    return c00[:, :, None], c01[:, :, None], c10[:, :, None], c11[:, :, None]


@triton.jit
def load_corners(v_base, i00, W, m00, m01, m10, m11, stride_vs, offs_d, stride_vd, dmask,
                  ACC: tl.constexpr):
    """The four [BLOCK_Q, BLOCK_P, BLOCK_D] corner rows around each sample
    (zeros where a corner is outside its level)."""
    p00, p10 = corner_rows(v_base, i00, W, stride_vs, offs_d, stride_vd)
    dm = dmask[None, None, :]
    v00 = tl.load(p00, mask=m00[:, :, None] & dm, other=0.0).to(ACC)
    v01 = tl.load(p00 + stride_vs, mask=m01[:, :, None] & dm, other=0.0).to(ACC)
    v10 = tl.load(p10, mask=m10[:, :, None] & dm, other=0.0).to(ACC)
    v11 = tl.load(p10 + stride_vs, mask=m11[:, :, None] & dm, other=0.0).to(ACC)
    return v00, v01, v10, v11


@triton.jit
def level_size(shapes_ptr, j):
    """H_j * W_j of level j (int32, as the kernels index value; an int64
    product truncated to int32 is the same number)."""
    return tl.load(shapes_ptr + 2 * j).to(tl.int32) * tl.load(shapes_ptr + 2 * j + 1).to(tl.int32)


@triton.jit
def level_start(shapes_ptr, l, L: tl.constexpr):
    """Where level l (any int32 tensor of levels < L) starts in S: the sum of
    H_j * W_j over j < l, derived from the shapes in the kernel, so that no
    launch computes level_start_index and none passed in is ever read."""
    start = tl.zeros_like(l)
    for j in tl.static_range(L - 1):
        start += tl.where(l > j, level_size(shapes_ptr, j), 0)
    return start


@triton.jit
def _point_chunk(p0, shapes_ptr, L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr):
    """chunk_points and the points' level geometry H, W, start ([BLOCK_P]
    each, int32)."""
    l, k, pmask = chunk_points(p0, L, K, BLOCK_P)
    H = tl.load(shapes_ptr + 2 * l).to(tl.int32)
    W = tl.load(shapes_ptr + 2 * l + 1).to(tl.int32)
    start = level_start(shapes_ptr, l, L)
    return l, k, pmask, H[None, :], W[None, :], start[None, :]


@triton.jit
def sample_chunk(p0, b, m, q, qmask, shapes_ptr, loc_ptr, attn_ptr, S,
                  stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
                  stride_ab, stride_aq, stride_am, stride_al, stride_ak,
                  L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr, ACC: tl.constexpr):
    """Everything about one chunk of points of this program's queries, as
    [BLOCK_Q, BLOCK_P] tiles: weight w, bilinear fractions lx, ly, corner
    00 index, the four corner masks, the level width W and height H, the
    live-sample mask, the (l, k) offsets for the per-point outputs and the
    locations x, y."""
    l, k, pmask, H, W, start = _point_chunk(p0, shapes_ptr, L, K, BLOCK_P)
    live = qmask[:, None] & pmask[None, :]
    lp = point_ptrs(loc_ptr, b, q, m, l, k, stride_lb, stride_lq, stride_lm, stride_ll,
                     stride_lk)
    x = tl.load(lp, mask=live, other=0.0).to(ACC)
    y = tl.load(lp + stride_lc, mask=live, other=0.0).to(ACC)
    w = tl.load(point_ptrs(attn_ptr, b, q, m, l, k, stride_ab, stride_aq, stride_am,
                            stride_al, stride_ak), mask=live, other=0.0).to(ACC)
    i00, m00, m01, m10, m11, lx, ly = bilinear_corners(x, y, H, W, start, S, live)
    return w, lx, ly, i00, m00, m01, m10, m11, W, H, live, l, k, x, y


@triton.jit
def chunk_logits(p0, b, m, q, qmask, attn_ptr, stride_ab, stride_aq, stride_am, stride_al,
                  stride_ak, L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr,
                  ACC: tl.constexpr):
    """[BLOCK_Q, BLOCK_P] logits of points p0 .. p0 + BLOCK_P (-inf where not
    live), the live mask and the (l, k) offsets."""
    l, k, pmask = chunk_points(p0, L, K, BLOCK_P)
    live = qmask[:, None] & pmask[None, :]
    logits = tl.load(point_ptrs(attn_ptr, b, q, m, l, k, stride_ab, stride_aq, stride_am,
                                 stride_al, stride_ak), mask=live, other=float("-inf"))
    return logits.to(ACC), live, l, k


@triton.jit
def max_logit(b, m, q, qmask, attn_ptr, stride_ab, stride_aq, stride_am, stride_al,
               stride_ak, L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr,
               ACC: tl.constexpr):
    """[BLOCK_Q] largest of the L * K attention logits of each query, read in
    chunks of BLOCK_P points; 0 for masked queries, so their exps stay finite."""
    row_max = tl.full(q.shape, float("-inf"), ACC)
    for p0 in range(0, L * K, BLOCK_P):
        logits, _, _, _ = chunk_logits(p0, b, m, q, qmask, attn_ptr, stride_ab, stride_aq,
                                        stride_am, stride_al, stride_ak, L, K, BLOCK_P, ACC)
        row_max = tl.maximum(row_max, tl.max(logits, axis=1))
    return tl.where(qmask, row_max, 0.0)


@triton.jit
def point_exps(logits, live, row_max):
    """exp(logit - row max) of a [BLOCK_Q, BLOCK_P] tile: the unnormalised
    softmax weights, 0 (exp(-inf)) at points past L * K and masked queries."""
    return tl.exp(tl.where(live, logits - row_max[:, None], float("-inf")))
