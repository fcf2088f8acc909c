"""The deterministic backward's bound (buckets.grad_value_bound)
in one kernel: per query max_d |grad_output| * sum_{l,k} |weight| times Q,
then its max over the queries by an integer atomic max on the float64 bits.

Non-negative floats order like their bits and NaN (sign cleared) lies above
inf, so a NaN query still sets its head's bound; a max does not depend on
the programs' order, so the bound is bitwise the same every run."""
import triton
import triton.language as tl

from ..jit_helpers import chunk_points, head_base, point_ptrs, program_tile, row_ptrs


@triton.jit
def query_max_ptrs(gq_ptr, b, q, m, Q):
    """Pointers to queries q's entries of a (B, Q, M) array (grid dim 1 is M):
    the per-query max |grad_output| the kernel below stores and the gather
    reads."""
    return gq_ptr + (b.to(tl.int64) * Q + q) * tl.num_programs(1) + m


@triton.jit
def grad_value_bound_kernel(
    grad_out_ptr, attn_ptr, bound_ptr, gq_ptr, Q, D: tl.constexpr,
    stride_gob, stride_goq, stride_gom, stride_god,
    stride_ab, stride_aq, stride_am, stride_al, stride_ak,
    L: tl.constexpr, K: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr, MAX_TY: tl.constexpr, SUM_TY: tl.constexpr,
):
    """bound_ptr (B, M) int64, zero-filled: the float64 bits of
    Q * max_q (max_d |go[b, q, m, d]| * sum_{l,k} |w[b, q, m, l, k]|).
    The max over d in MAX_TY (exact for go's dtype), the sum in SUM_TY (fp32
    at least: 16-bit sums could overflow), their product in float64 (exact
    for fp32 factors).  gq_ptr, unless None: each query's max over its
    finite |go[b, q, m, d]| into a (B, Q, M) array of MAX_TY (the gather's
    per-query scale).
    Grid: (cdiv(Q, BLOCK_Q), M, B)."""
    b, m, q, qmask, offs_d, dmask = program_tile(Q, D, BLOCK_Q, BLOCK_D)
    go = tl.load(row_ptrs(head_base(grad_out_ptr, b, m, stride_gob, stride_gom), q,
                           stride_goq, offs_d, stride_god),
                 mask=qmask[:, None] & dmask[None, :], other=0.0).to(MAX_TY)
    # A max of the bits, not of the floats: tl.max drops NaN.
    BITS: tl.constexpr = tl.int64 if MAX_TY == tl.float64 else tl.int32
    bits = tl.abs(go).to(BITS, bitcast=True)
    go_max = tl.max(bits, axis=1).to(MAX_TY, bitcast=True)
    if gq_ptr is not None:
        # The finite channels' max: the scale of the query's finite terms (the
        # gather sums inf and NaN terms apart).  Finite floats' bits lie below inf's.
        INF: tl.constexpr = 0x7FF0000000000000 if MAX_TY == tl.float64 else 0x7F800000
        finite_max = tl.max(tl.where(bits < INF, bits, 0), axis=1).to(MAX_TY, bitcast=True)
        tl.store(query_max_ptrs(gq_ptr, b, q, m, Q), finite_max, mask=qmask)
    w_sum = tl.zeros([BLOCK_Q], dtype=SUM_TY)
    for p0 in range(0, L * K, BLOCK_P):
        lvl, k, pmask = chunk_points(p0, L, K, BLOCK_P)
        w = tl.load(point_ptrs(attn_ptr, b, q, m, lvl, k, stride_ab, stride_aq, stride_am,
                                stride_al, stride_ak),
                    mask=qmask[:, None] & pmask[None, :], other=0.0).to(SUM_TY)
        w_sum += tl.sum(tl.abs(w), axis=1)
    # tl.full, not Q.to(): Triton passes Q = 1 as a constant int.
    query = go_max.to(tl.float64) * w_sum.to(tl.float64) * tl.full([BLOCK_Q], Q, tl.float64)
    # Sign cleared: a NaN product (0 * inf) may come out negative.
    bits = query.to(tl.int64, bitcast=True) & 0x7FFFFFFFFFFFFFFF
    tl.atomic_max(bound_ptr + b.to(tl.int64) * tl.num_programs(1) + m,
                  tl.max(tl.where(qmask, bits, 0), axis=0), sem="relaxed")
