"""Triton kernels for Multi-Scale Deformable Attention.

One program owns a tile of BLOCK_Q queries of one (batch, head) pair and the
whole head dimension: every sampled corner is a contiguous row of D values,
so the gathers (forward) and the scattered atomic adds (backward) are
row-vectorised along D.  Locations and weights are read in whatever float
dtype they come in and all arithmetic is in ACC (fp32, or fp64 when an input
is fp64, which gradcheck needs); only the stores round.

Offsets into value/grad_value/output are int64 so tensors past 2**31
elements work.  Level shapes and start offsets are read on the device: no
host synchronisation, so a launch is CUDA-graph capturable.

Sampling follows ``F.grid_sample(align_corners=False, padding_mode='zeros')``:
pixel coordinate ``x * W - 0.5``, corners outside the level read as zero.
"""
import triton
import triton.language as tl


@triton.jit
def _bilinear_corners(x, y, H, W, start, S, active):
    """Corner indices, masks and bilinear fractions of a [BLOCK_Q] vector of
    normalised (x, y) locations in one level of H x W starting at ``start``.

    NaN fails every comparison and +-inf fails one, so a non-finite location
    has no live corner and contributes (and receives) exactly zero.
    """
    x_im = x * W - 0.5
    y_im = y * H - 0.5
    ok = active & (x_im >= -1.0) & (x_im < W) & (y_im >= -1.0) & (y_im < H)
    x_im = tl.where(ok, x_im, 0.0)
    y_im = tl.where(ok, y_im, 0.0)
    x0f = tl.floor(x_im)
    y0f = tl.floor(y_im)
    lx = x_im - x0f
    ly = y_im - y0f
    x0 = x0f.to(tl.int32)
    y0 = y0f.to(tl.int32)
    # With ok, -1 <= x0 <= W-1, so only x0 >= 0 and x0 + 1 < W can fail.
    mx0 = x0 >= 0
    mx1 = x0 + 1 < W
    my0 = ok & (y0 >= 0)
    my1 = ok & (y0 + 1 < H)
    i00 = start + y0 * W + x0
    # `< S` keeps a spatial_shapes that disagrees with value's S from
    # reading or writing out of bounds.
    m00 = my0 & mx0 & (i00 < S)
    m01 = my0 & mx1 & (i00 + 1 < S)
    m10 = my1 & mx0 & (i00 + W < S)
    m11 = my1 & mx1 & (i00 + W + 1 < S)
    return i00, m00, m01, m10, m11, lx, ly


@triton.jit
def _row_ptrs(base, idx, stride_s, offs_d, stride_d):
    return base + idx.to(tl.int64)[:, None] * stride_s + (offs_d * stride_d)[None, :]


@triton.jit
def _head_base(ptr, b, m, stride_b, stride_m):
    return ptr + b.to(tl.int64) * stride_b + m * stride_m


@triton.jit
def _point_ptrs(ptr, b, q, m, stride_b, stride_q, stride_m):
    return _head_base(ptr, b, m, stride_b, stride_m) + q.to(tl.int64) * stride_q


@triton.jit
def _program_tile(Q, M, D, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's batch b, head m, [BLOCK_Q] queries and [BLOCK_D] head
    channels, with their bounds masks.  Query blocks vary fastest."""
    pid = tl.program_id(0)
    num_qb = tl.cdiv(Q, BLOCK_Q)
    bm = pid // num_qb
    q = (pid % num_qb) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, BLOCK_D)
    return bm // M, bm % M, q, q < Q, offs_d, offs_d < D


@triton.jit
def _level(shapes_ptr, starts_ptr, l):
    return tl.load(shapes_ptr + 2 * l), tl.load(shapes_ptr + 2 * l + 1), tl.load(starts_ptr + l)


@triton.jit
def _sample_point(loc_base, attn_base, l, k, stride_ll, stride_lk, stride_lc, stride_al,
                  stride_ak, H, W, start, S, qmask, ACC: tl.constexpr):
    """Weight, corner indices/masks and bilinear fractions of point (l, k)
    for a [BLOCK_Q] vector of queries."""
    lp = loc_base + l * stride_ll + k * stride_lk
    x = tl.load(lp, mask=qmask, other=0.0).to(ACC)
    y = tl.load(lp + stride_lc, mask=qmask, other=0.0).to(ACC)
    w = tl.load(attn_base + l * stride_al + k * stride_ak, mask=qmask, other=0.0).to(ACC)
    i00, m00, m01, m10, m11, lx, ly = _bilinear_corners(x, y, H, W, start, S, qmask)
    return w, i00, m00, m01, m10, m11, lx, ly


@triton.jit
def _load_corners(v_base, i00, W, m00, m01, m10, m11, stride_vs, offs_d, stride_vd, dmask,
                  ACC: tl.constexpr):
    """The four [BLOCK_Q, BLOCK_D] corner rows around each sample (zeros
    where a corner is outside its level)."""
    p00 = _row_ptrs(v_base, i00, stride_vs, offs_d, stride_vd)
    p10 = p00 + W.to(tl.int64) * stride_vs
    dm = dmask[None, :]
    v00 = tl.load(p00, mask=m00[:, None] & dm, other=0.0).to(ACC)
    v01 = tl.load(p00 + stride_vs, mask=m01[:, None] & dm, other=0.0).to(ACC)
    v10 = tl.load(p10, mask=m10[:, None] & dm, other=0.0).to(ACC)
    v11 = tl.load(p10 + stride_vs, mask=m11[:, None] & dm, other=0.0).to(ACC)
    return v00, v01, v10, v11


@triton.jit
def msda_fwd_kernel(
    value_ptr, shapes_ptr, starts_ptr, loc_ptr, attn_ptr, out_ptr,
    Q, M, S, D,
    stride_vb, stride_vs, stride_vm, stride_vd,
    stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
    stride_ab, stride_aq, stride_am, stride_al, stride_ak,
    stride_ob, stride_oq, stride_om, stride_od,
    L: tl.constexpr, K: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
    ACC: tl.constexpr,
):
    """out[b, q, m, :] = sum_{l,k} attn[b,q,m,l,k] * bilinear(value[b, level l, m, :], loc[b,q,m,l,k]).

    value (B, S, M, D); loc (B, Q, M, L, K, 2); attn (B, Q, M, L, K);
    out (B, Q, M, D); shapes (L, 2) int (H, W); starts (L,) int.
    Grid: (cdiv(Q, BLOCK_Q) * B * M,), query blocks fastest so that
    neighbouring programs sample neighbouring rows of the same head.
    """
    b, m, q, qmask, offs_d, dmask = _program_tile(Q, M, D, BLOCK_Q, BLOCK_D)

    v_base = _head_base(value_ptr, b, m, stride_vb, stride_vm)
    loc_base = _point_ptrs(loc_ptr, b, q, m, stride_lb, stride_lq, stride_lm)
    attn_base = _point_ptrs(attn_ptr, b, q, m, stride_ab, stride_aq, stride_am)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], dtype=ACC)
    for l in tl.static_range(L):
        H, W, start = _level(shapes_ptr, starts_ptr, l)
        for k in range(K):
            w, i00, m00, m01, m10, m11, lx, ly = _sample_point(
                loc_base, attn_base, l, k, stride_ll, stride_lk, stride_lc, stride_al, stride_ak,
                H, W, start, S, qmask, ACC)
            v00, v01, v10, v11 = _load_corners(v_base, i00, W, m00, m01, m10, m11, stride_vs,
                                               offs_d, stride_vd, dmask, ACC)
            hx = 1.0 - lx
            hy = 1.0 - ly
            acc += (w * hy * hx)[:, None] * v00 + (w * hy * lx)[:, None] * v01 \
                + (w * ly * hx)[:, None] * v10 + (w * ly * lx)[:, None] * v11

    o_ptrs = _row_ptrs(_head_base(out_ptr, b, m, stride_ob, stride_om), q, stride_oq,
                       offs_d, stride_od)
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=qmask[:, None] & dmask[None, :])


@triton.jit
def msda_bwd_kernel(
    grad_out_ptr, value_ptr, shapes_ptr, starts_ptr, loc_ptr, attn_ptr,
    grad_value_ptr, grad_loc_ptr, grad_attn_ptr,
    Q, M, S, D,
    stride_gob, stride_goq, stride_gom, stride_god,
    stride_vb, stride_vs, stride_vm, stride_vd,
    stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
    stride_ab, stride_aq, stride_am, stride_al, stride_ak,
    stride_gvb, stride_gvs, stride_gvm,
    stride_glb, stride_glq, stride_glm, stride_gll, stride_glk, stride_glc,
    stride_gab, stride_gaq, stride_gam, stride_gal, stride_gak,
    L: tl.constexpr, K: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
    ACC: tl.constexpr,
):
    """All three gradients of msda_fwd_kernel, same tiling and grid.

    grad_out (B, Q, M, D); grad_value (B, S, M, D), zero-filled, contiguous
    along D, accumulated with relaxed atomics (its dtype decides the atomic:
    value's own, or fp32 scratch); grad_loc (B, Q, M, L, K, 2) and
    grad_attn (B, Q, M, L, K) are written once per element.
    """
    b, m, q, qmask, offs_d, dmask = _program_tile(Q, M, D, BLOCK_Q, BLOCK_D)
    dm = dmask[None, :]

    go_ptrs = _row_ptrs(_head_base(grad_out_ptr, b, m, stride_gob, stride_gom), q,
                        stride_goq, offs_d, stride_god)
    go = tl.load(go_ptrs, mask=qmask[:, None] & dm, other=0.0).to(ACC)

    v_base = _head_base(value_ptr, b, m, stride_vb, stride_vm)
    gv_base = _head_base(grad_value_ptr, b, m, stride_gvb, stride_gvm)
    gv_ty = grad_value_ptr.dtype.element_ty
    loc_base = _point_ptrs(loc_ptr, b, q, m, stride_lb, stride_lq, stride_lm)
    attn_base = _point_ptrs(attn_ptr, b, q, m, stride_ab, stride_aq, stride_am)
    gl_base = _point_ptrs(grad_loc_ptr, b, q, m, stride_glb, stride_glq, stride_glm)
    ga_base = _point_ptrs(grad_attn_ptr, b, q, m, stride_gab, stride_gaq, stride_gam)
    for l in tl.static_range(L):
        H, W, start = _level(shapes_ptr, starts_ptr, l)
        for k in range(K):
            w, i00, m00, m01, m10, m11, lx, ly = _sample_point(
                loc_base, attn_base, l, k, stride_ll, stride_lk, stride_lc, stride_al, stride_ak,
                H, W, start, S, qmask, ACC)
            v00, v01, v10, v11 = _load_corners(v_base, i00, W, m00, m01, m10, m11, stride_vs,
                                               offs_d, stride_vd, dmask, ACC)
            # s_c = <grad_out, corner row c>: everything the location and
            # weight gradients need from the value.
            s00 = tl.sum(go * v00, axis=1)
            s01 = tl.sum(go * v01, axis=1)
            s10 = tl.sum(go * v10, axis=1)
            s11 = tl.sum(go * v11, axis=1)
            hx = 1.0 - lx
            hy = 1.0 - ly
            g_attn = hy * (hx * s00 + lx * s01) + ly * (hx * s10 + lx * s11)
            g_x = w * W * (hy * (s01 - s00) + ly * (s11 - s10))
            g_y = w * H * (hx * (s10 - s00) + lx * (s11 - s01))
            glp = gl_base + l * stride_gll + k * stride_glk
            tl.store(glp, g_x.to(grad_loc_ptr.dtype.element_ty), mask=qmask)
            tl.store(glp + stride_glc, g_y.to(grad_loc_ptr.dtype.element_ty), mask=qmask)
            tl.store(ga_base + l * stride_gal + k * stride_gak,
                     g_attn.to(grad_attn_ptr.dtype.element_ty), mask=qmask)

            g00 = _row_ptrs(gv_base, i00, stride_gvs, offs_d, 1)
            g10 = g00 + W.to(tl.int64) * stride_gvs
            tl.atomic_add(g00, ((w * hy * hx)[:, None] * go).to(gv_ty),
                          mask=m00[:, None] & dm, sem="relaxed")
            tl.atomic_add(g00 + stride_gvs, ((w * hy * lx)[:, None] * go).to(gv_ty),
                          mask=m01[:, None] & dm, sem="relaxed")
            tl.atomic_add(g10, ((w * ly * hx)[:, None] * go).to(gv_ty),
                          mask=m10[:, None] & dm, sem="relaxed")
            tl.atomic_add(g10 + stride_gvs, ((w * ly * lx)[:, None] * go).to(gv_ty),
                          mask=m11[:, None] & dm, sem="relaxed")
