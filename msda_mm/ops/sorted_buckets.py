"""The deterministic backward's stable sort, for dense value rows: the
buckets of bucket_kernels.py with their entries in sample order, so that
grad_value_gather_kernel can sum them in float, in that order, in one pass.

sample_keys_kernel stores each sample's bucket (its key), a stable radix sort
(torch.sort) orders the samples by key and sample, bucket_starts_kernel finds
where each bucket starts in that order, and sorted_fill_kernel writes each
entry's record (bucket_kernels._record_words) there.  Nothing depends on the
order in which programs run: the same entries in the same order every run.
"""
import triton
import triton.language as tl

from .bucket_kernels import _record_ptrs, _record_words, _sample_buckets
from .cells import _cell
from .kernels import _chunk_points, _program_queries


@triton.jit
def sample_keys_kernel(shapes_ptr, loc_ptr, keys_ptr, Q, CELLS,
                       stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
                       L: tl.constexpr, K: tl.constexpr, BLOCK_Q: tl.constexpr,
                       BLOCK_P: tl.constexpr, ACC: tl.constexpr):
    """Each sample's bucket (cells._sample_bucket) at its slot
    (cells._sample_slot) of keys; B * M * CELLS, past every bucket, where it
    is not live.  Grid: (cdiv(Q, BLOCK_Q), M, B)."""
    b, m, q, qmask = _program_queries(Q, BLOCK_Q)
    dead = tl.num_programs(2).to(tl.int64) * tl.num_programs(1) * CELLS
    for p0 in range(0, L * K, BLOCK_P):
        live, bucket, slot, _, _, _, _ = _sample_buckets(
            p0, b, m, q, qmask, Q, CELLS, shapes_ptr, loc_ptr, stride_lb, stride_lq, stride_lm,
            stride_ll, stride_lk, stride_lc, L, K, BLOCK_P, ACC)
        _, _, pmask = _chunk_points(p0, L, K, BLOCK_P)
        tl.store(keys_ptr + slot, tl.where(live, bucket, dead).to(keys_ptr.dtype.element_ty),
                 mask=qmask[:, None] & pmask[None, :])


@triton.jit
def bucket_starts_kernel(sorted_ptr, offsets_ptr, N, BUCKETS, STEPS, BLOCK: tl.constexpr):
    """offsets[c], c in [0, BUCKETS): how many of the N sorted keys lie
    below c (bucket c's first entry), by binary search in STEPS >= the bit
    length of N halvings."""
    c = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    lo = tl.zeros([BLOCK], dtype=tl.int64)
    hi = tl.full([BLOCK], N, dtype=tl.int64)
    for _ in range(STEPS):
        open_ = lo < hi
        mid = (lo + hi) // 2
        below = tl.load(sorted_ptr + mid, mask=open_, other=0) < c
        lo = tl.where(open_ & below, mid + 1, lo)
        hi = tl.where(open_ & ~below, mid, hi)
    tl.store(offsets_ptr + c, lo.to(offsets_ptr.dtype.element_ty), mask=c < BUCKETS)


@triton.jit
def sorted_fill_kernel(perm_ptr, shapes_ptr, loc_ptr, attn_ptr, records_ptr, N, Q, M,
                       stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
                       stride_ab, stride_aq, stride_am, stride_al, stride_ak,
                       L: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr,
                       ACC: tl.constexpr):
    """records[j] for j in [0, N): the record of sample perm[j] (its slot in
    the (B, M, Q, L*K) samples), with the weight and bilinear fractions
    computed as msda_bwd_kernel computes them.  Dead samples, sorted last,
    get records that no bucket reaches."""
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = j < N
    slot = tl.load(perm_ptr + j, mask=ok, other=0).to(tl.int64)
    point = slot % (L * K)
    q = slot // (L * K) % Q
    head = slot // (L * K) // Q
    b = head // M
    m = head % M
    lvl = (point // K).to(tl.int32)
    k = (point % K).to(tl.int32)
    lp = loc_ptr + b * stride_lb + q * stride_lq + m * stride_lm + lvl * stride_ll + k * stride_lk
    x = tl.load(lp, mask=ok, other=0.0).to(ACC)
    y = tl.load(lp + stride_lc, mask=ok, other=0.0).to(ACC)
    H = tl.load(shapes_ptr + 2 * lvl, mask=ok, other=1).to(tl.int32)
    W = tl.load(shapes_ptr + 2 * lvl + 1, mask=ok, other=1).to(tl.int32)
    _, _, _, lx, ly = _cell(x, y, H, W, ok)
    w = tl.load(attn_ptr + b * stride_ab + q * stride_aq + m * stride_am + lvl * stride_al
                + k * stride_ak, mask=ok, other=0.0).to(ACC)
    tl.store(_record_ptrs(records_ptr, j[:, None]),
             _record_words(q, w[:, None], lx[:, None], ly[:, None],
                           records_ptr.dtype.element_ty), mask=ok[:, None, None])
