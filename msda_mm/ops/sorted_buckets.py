"""The deterministic backward's stable sort, for dense value rows: the
buckets of bucket_kernels.py with their entries in sample order, so that
grad_value_gather_kernel can sum them in float, in that order, in one pass.

sample_keys_kernel stores each sample's cell in its head (its key: 16 bits
where the cells allow, so that the radix sort makes two passes, not four), a
stable radix sort (torch.sort) orders the samples by cell and then by slot,
whose order is head by head: by (cell, head, slot).  bucket_starts_kernel
finds where each (cell, head) starts in that order and counts each bucket,
and sorted_fill_kernel writes each entry's record
(bucket_kernels._record_words) in the buckets' order, (head, cell, slot).
Nothing depends on the order in which programs run: the same entries in the
same order every run.
"""
import triton
import triton.language as tl

from .bucket_kernels import _record_ptrs, _record_words, _sample_buckets
from .cells import _cell
from .kernels import _chunk_points, _program_queries


@triton.jit
def sample_keys_kernel(shapes_ptr, loc_ptr, keys_ptr, Q, CELLS, KEY_BIAS,
                       stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
                       L: tl.constexpr, K: tl.constexpr, BLOCK_Q: tl.constexpr,
                       BLOCK_P: tl.constexpr, ACC: tl.constexpr):
    """Each sample's cell in its head (cells._sample_bucket) plus KEY_BIAS
    at its slot (cells._sample_slot) of keys; CELLS + KEY_BIAS, past every
    cell, where it is not live.  Grid: (cdiv(Q, BLOCK_Q), M, B)."""
    b, m, q, qmask = _program_queries(Q, BLOCK_Q)
    head = (b.to(tl.int64) * tl.num_programs(1) + m) * CELLS
    for p0 in range(0, L * K, BLOCK_P):
        live, bucket, slot, _, _, _, _ = _sample_buckets(
            p0, b, m, q, qmask, Q, CELLS, shapes_ptr, loc_ptr, stride_lb, stride_lq, stride_lm,
            stride_ll, stride_lk, stride_lc, L, K, BLOCK_P, ACC)
        _, _, pmask = _chunk_points(p0, L, K, BLOCK_P)
        key = tl.where(live, bucket - head, CELLS) + KEY_BIAS
        tl.store(keys_ptr + slot, key.to(keys_ptr.dtype.element_ty),
                 mask=qmask[:, None] & pmask[None, :])


@triton.jit
def _sorted_pair(sorted_ptr, perm_ptr, j, mask, HEADS, HEAD_SAMPLES, KEY_BIAS):
    """Sorted entry j's cell (its key less KEY_BIAS), slot (int64 both) and
    (cell, head) pair cell * HEADS + head, which the sort leaves in order
    (slots run head by head, HEAD_SAMPLES a head)."""
    cell = tl.load(sorted_ptr + j, mask=mask, other=0).to(tl.int64) - KEY_BIAS
    slot = tl.load(perm_ptr + j, mask=mask, other=0).to(tl.int64)
    return cell, slot, cell * HEADS + slot // HEAD_SAMPLES


@triton.jit
def _lower_bound(sorted_ptr, perm_ptr, pair, N, HEADS, HEAD_SAMPLES, KEY_BIAS, STEPS):
    """How many of the N sorted entries have a (cell, head) pair below
    ``pair`` (int64), by binary search in STEPS >= the bit length of N
    halvings."""
    lo = tl.zeros(pair.shape, dtype=tl.int64)
    hi = tl.full(pair.shape, N, dtype=tl.int64)
    for _ in range(STEPS):
        open_ = lo < hi
        mid = (lo + hi) // 2
        _, _, at = _sorted_pair(sorted_ptr, perm_ptr, mid, open_, HEADS, HEAD_SAMPLES, KEY_BIAS)
        below = at < pair
        lo = tl.where(open_ & below, mid + 1, lo)
        hi = tl.where(open_ & ~below, mid, hi)
    return lo


@triton.jit
def bucket_starts_kernel(sorted_ptr, perm_ptr, starts_ptr, counts_ptr, N, CELLS, HEADS,
                         HEAD_SAMPLES, KEY_BIAS, STEPS, BLOCK: tl.constexpr):
    """For each (cell, head) pair p = cell * HEADS + head, p < CELLS * HEADS:
    starts[p], its first entry in the sort's order, and its count at
    counts[1 + head * CELLS + cell], the buckets' order (counts[0] is 0:
    their cumsum is where each bucket starts once sorted_fill_kernel has
    moved it)."""
    pair = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = pair < CELLS * HEADS
    first = _lower_bound(sorted_ptr, perm_ptr, pair, N, HEADS, HEAD_SAMPLES, KEY_BIAS, STEPS)
    end = _lower_bound(sorted_ptr, perm_ptr, pair + 1, N, HEADS, HEAD_SAMPLES, KEY_BIAS, STEPS)
    tl.store(starts_ptr + pair, first.to(starts_ptr.dtype.element_ty), mask=ok)
    bucket = pair % HEADS * CELLS + pair // HEADS
    tl.store(counts_ptr + 1 + bucket, (end - first).to(counts_ptr.dtype.element_ty), mask=ok)
    tl.store(counts_ptr + pair, tl.zeros_like(end).to(counts_ptr.dtype.element_ty),
             mask=pair == 0)


@triton.jit
def sorted_fill_kernel(sorted_ptr, perm_ptr, starts_ptr, offsets_ptr, shapes_ptr, loc_ptr,
                       attn_ptr, records_ptr, N, Q, M, CELLS, HEADS, KEY_BIAS,
                       stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
                       stride_ab, stride_aq, stride_am, stride_al, stride_ak,
                       L: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr,
                       ACC: tl.constexpr):
    """The record of sorted entry j in [0, N) (sample perm[j], its slot in
    the (B, M, Q, L*K) samples), with the weight and bilinear fractions
    computed as msda_bwd_kernel computes them, at its bucket's start
    (offsets, in the buckets' order) plus its place in the bucket (j less
    the start of its (cell, head) pair in the sort's order).  Dead samples,
    sorted last, get no record."""
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    cell, slot, pair = _sorted_pair(sorted_ptr, perm_ptr, j, j < N, HEADS, Q * (L * K),
                                    KEY_BIAS)
    live = (j < N) & (cell < CELLS)
    point = slot % (L * K)
    q = slot // (L * K) % Q
    head = slot // (L * K) // Q
    b = head // M
    m = head % M
    lvl = (point // K).to(tl.int32)
    k = (point % K).to(tl.int32)
    lp = loc_ptr + b * stride_lb + q * stride_lq + m * stride_lm + lvl * stride_ll + k * stride_lk
    x = tl.load(lp, mask=live, other=0.0).to(ACC)
    y = tl.load(lp + stride_lc, mask=live, other=0.0).to(ACC)
    H = tl.load(shapes_ptr + 2 * lvl, mask=live, other=1).to(tl.int32)
    W = tl.load(shapes_ptr + 2 * lvl + 1, mask=live, other=1).to(tl.int32)
    _, _, _, lx, ly = _cell(x, y, H, W, live)
    w = tl.load(attn_ptr + b * stride_ab + q * stride_aq + m * stride_am + lvl * stride_al
                + k * stride_ak, mask=live, other=0.0).to(ACC)
    entry = (tl.load(offsets_ptr + head * CELLS + cell, mask=live, other=0).to(tl.int64)
             + j - tl.load(starts_ptr + pair, mask=live, other=0))
    tl.store(_record_ptrs(records_ptr, entry[:, None]),
             _record_words(q, w[:, None], lx[:, None], ly[:, None],
                           records_ptr.dtype.element_ty), mask=live[:, None, None])
