"""The backward kernels: msda_bwd_kernel, all three gradients in the
forward's tiling (forward/kernels.py), grad_value by float atomics or, for
the deterministic backward, not at all (the sort's ranks or keys in its
place); and zero_fill_kernel, grad_value's fill in front of it."""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..deterministic.cells import key_samples, rank_samples
from ..jit_helpers import head_base, point_ptrs, program_tile, row_ptrs
from ..sampling import (
    chunk_logits,
    corner_rows,
    corner_weights,
    load_corners,
    max_logit,
    point_exps,
    sample_chunk,
)


@triton.jit
def _softmax_stats(b, m, q, qmask, attn_ptr, stride_ab, stride_aq, stride_am, stride_al,
                   stride_ak, L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr,
                   ACC: tl.constexpr):
    """[BLOCK_Q] row max and 1 / sum of exps of each query's L * K logits:
    two passes over them, so that the backward's main loop gets the softmax
    weights themselves.  Masked queries get 1 / 1 (they are never stored)."""
    row_max = max_logit(b, m, q, qmask, attn_ptr, stride_ab, stride_aq, stride_am, stride_al,
                         stride_ak, L, K, BLOCK_P, ACC)
    row_sum = tl.zeros_like(row_max)
    for p0 in range(0, L * K, BLOCK_P):
        logits, live, _, _ = chunk_logits(p0, b, m, q, qmask, attn_ptr, stride_ab, stride_aq,
                                           stride_am, stride_al, stride_ak, L, K, BLOCK_P, ACC)
        row_sum += tl.sum(point_exps(logits, live, row_max), axis=1)
    return row_max, 1.0 / tl.where(qmask, row_sum, 1.0)


@triton.jit
def _point_softmax(logits, live, row_max, inv_sum):
    """The softmax weights p of a [BLOCK_Q, BLOCK_P] tile of logits, from
    _softmax_stats' row max and 1 / sum (0 where not live)."""
    return point_exps(logits, live, row_max) * inv_sum[:, None]


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
        logits, live, l, k = chunk_logits(p0, b, m, q, qmask, attn_ptr, stride_ab, stride_aq,
                                           stride_am, stride_al, stride_ak, L, K, BLOCK_P, ACC)
        p = _point_softmax(logits, live, row_max, inv_sum)
        g = tl.load(point_ptrs(grad_attn_ptr, b, q, m, l, k, stride_gab, stride_gaq,
                                stride_gam, stride_gal, stride_gak), mask=live, other=0.0)
        # In place, every thread holding a copy of an element (tiles narrower
        # than the CTA replicate it, across warps too) reads g before any writes.
        tl.debug_barrier()
        tl.store(point_ptrs(grad_logit_ptr, b, q, m, l, k, stride_gab, stride_gaq, stride_gam,
                             stride_gal, stride_gak),
                 (p * (g.to(ACC) - dot[:, None])).to(grad_logit_ptr.dtype.element_ty), mask=live)


@triton.jit
def msda_bwd_kernel(
    grad_out_ptr, value_ptr, shapes_ptr, loc_ptr, attn_ptr,
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
    sort's ranks of the samples in their buckets (deterministic/cells.py's rank_samples).
    keys_ptr not None (with records_ptr, CELLS and KEY_BIAS): also the stable
    sort's keys and records of the samples (deterministic/cells.py's key_samples).

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
    b, m, q, qmask, offs_d, dmask = program_tile(Q, D, BLOCK_Q, BLOCK_D)
    dm = dmask[None, None, :]
    go_ptrs = row_ptrs(head_base(grad_out_ptr, b, m, stride_gob, stride_gom), q,
                        stride_goq, offs_d, stride_god)
    go = tl.load(go_ptrs, mask=qmask[:, None] & dmask[None, :], other=0.0).to(ACC)[:, None, :]

    v_base = head_base(value_ptr, b, m, stride_vb, stride_vm)
    if SOFTMAX:
        row_max, inv_sum = _softmax_stats(b, m, q, qmask, attn_ptr, stride_ab, stride_aq,
                                          stride_am, stride_al, stride_ak, L, K, BLOCK_P, ACC)
        dot = tl.zeros_like(row_max)
    for p0 in range(0, L * K, BLOCK_P):
        w, lx, ly, i00, m00, m01, m10, m11, W, H, live, l, k, x, y = sample_chunk(
            p0, b, m, q, qmask, shapes_ptr, loc_ptr, attn_ptr, S,
            stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
            stride_ab, stride_aq, stride_am, stride_al, stride_ak, L, K, BLOCK_P, ACC)
        if counts_ptr is not None:
            # The counting sort's ranks, from this chunk's locations (its cells
            # are bilinear_corners', computed once).
            rank_samples(x, y, l, H, W, live, p0, b, m, q, Q, CELLS, shapes_ptr, ranks_ptr,
                          counts_ptr, L, K, BLOCK_P)
        if keys_ptr is not None:
            # The stable sort's keys and records, where the locations and weights are read.
            key_samples(x, y, l, H, W, live, w, p0, b, m, q, Q, CELLS, KEY_BIAS, shapes_ptr,
                         keys_ptr, records_ptr, L, K, BLOCK_P)
        if SOFTMAX:
            w = _point_softmax(w, live, row_max, inv_sum)
        v00, v01, v10, v11 = load_corners(v_base, i00, W, m00, m01, m10, m11, stride_vs,
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
        glp = point_ptrs(grad_loc_ptr, b, q, m, l, k, stride_glb, stride_glq, stride_glm,
                          stride_gll, stride_glk)
        tl.store(glp, g_x.to(grad_loc_ptr.dtype.element_ty), mask=live)
        tl.store(glp + stride_glc, g_y.to(grad_loc_ptr.dtype.element_ty), mask=live)
        tl.store(point_ptrs(grad_attn_ptr, b, q, m, l, k, stride_gab, stride_gaq, stride_gam,
                             stride_gal, stride_gak),
                 g_attn.to(grad_attn_ptr.dtype.element_ty), mask=live)

        if grad_value_ptr is not None:
            gv_ty = grad_value_ptr.dtype.element_ty
            gv_base = head_base(grad_value_ptr, b, m, stride_gvb, stride_gvm)
            c00, c01, c10, c11 = corner_weights(w, lx, ly)
            g00, g10 = corner_rows(gv_base, i00, W, stride_gvs, offs_d, 1)
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
