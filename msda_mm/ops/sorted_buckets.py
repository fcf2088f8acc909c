"""The deterministic backward's stable sort, for value rows of 2 entries or
more (launch.deterministic_sort): the buckets of bucket_kernels.py with their
entries in sample order, so that grad_value_gather_kernel can sum them in
float, in that order, in one pass.

sample_keys_kernel stores each sample's cell in its head (its key: 16 bits
where the cells allow, so that the radix sort makes two passes, not four), a
stable radix sort (torch.sort) orders the samples by cell and then by slot,
whose order is head by head: by (cell, head, slot), each bucket (head, cell)
contiguous.  sorted_fill_kernel finds where each bucket starts and ends in
that order and moves each entry's record
(bucket_kernels._record_words), which the keys kernel wrote in sample order
where it read the locations and weights in order, there.
Nothing depends on the order in which programs run: the same entries in the
same order every run.
"""
import triton
import triton.language as tl

from .bucket_kernels import _record_ptrs, _sample_records
from .kernels import _chunk_points, _program_queries


@triton.jit
def sample_keys_kernel(shapes_ptr, loc_ptr, attn_ptr, keys_ptr, records_ptr, Q, CELLS, KEY_BIAS,
                       stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
                       stride_ab, stride_aq, stride_am, stride_al, stride_ak,
                       L: tl.constexpr, K: tl.constexpr, BLOCK_Q: tl.constexpr,
                       BLOCK_P: tl.constexpr, ACC: tl.constexpr):
    """Each sample's cell in its head (cells._sample_bucket) plus KEY_BIAS
    at its slot (cells._sample_slot) of keys, CELLS + KEY_BIAS, past every
    cell, where it is not live; and a live sample's record
    (bucket_kernels._record_words) at its slot of records, where the
    locations and weights are read in order.  Grid: (cdiv(Q, BLOCK_Q), M, B)."""
    b, m, q, qmask = _program_queries(Q, BLOCK_Q)
    head = (b.to(tl.int64) * tl.num_programs(1) + m) * CELLS
    for p0 in range(0, L * K, BLOCK_P):
        live, bucket, slot, words = _sample_records(
            p0, b, m, q, qmask, Q, CELLS, shapes_ptr, loc_ptr, attn_ptr,
            stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
            stride_ab, stride_aq, stride_am, stride_al, stride_ak, L, K, BLOCK_P, ACC,
            records_ptr.dtype.element_ty)
        _, _, pmask = _chunk_points(p0, L, K, BLOCK_P)
        key = tl.where(live, bucket - head, CELLS) + KEY_BIAS
        tl.store(keys_ptr + slot, key.to(keys_ptr.dtype.element_ty),
                 mask=qmask[:, None] & pmask[None, :])
        tl.store(_record_ptrs(records_ptr, slot), words, mask=live[:, :, None])


@triton.jit
def _sorted_pair(sorted_ptr, perm_ptr, j, mask, HEADS, HEAD_SAMPLES, KEY_BIAS,
                 INDEX: tl.constexpr):
    """Sorted entries j's cells (CELLS for dead samples) and (cell, head)
    pairs cell * HEADS + head (INDEX; slots run head by head, HEAD_SAMPLES a
    head), which the sort leaves in order.  INDEX int32 where every slot and
    live pair fits: its division is a fraction of int64's instructions."""
    cell = tl.load(sorted_ptr + j, mask=mask, other=0).to(INDEX) - KEY_BIAS
    slot = tl.load(perm_ptr + j, mask=mask, other=0).to(INDEX)
    return cell, cell * HEADS + slot // HEAD_SAMPLES


@triton.jit
def _bucket_bounds(sorted_ptr, perm_ptr, bounds_ptr, j, ok, N, CELLS, HEADS, HEAD_SAMPLES,
                   KEY_BIAS):
    """Where each bucket's entries start and end among the N sorted ones:
    bounds (2, CELLS * HEADS), zeros first, of the index dtype (int32 where
    N and the pairs fit), indexed by (cell, head) pair (_sorted_pair).
    Entry j is its bucket's first where the pair before it differs, its last
    where the pair after it does; empty buckets keep (0, 0)."""
    index = bounds_ptr.dtype.element_ty
    cell, pair = _sorted_pair(sorted_ptr, perm_ptr, j, ok, HEADS, HEAD_SAMPLES, KEY_BIAS, index)
    _, before = _sorted_pair(sorted_ptr, perm_ptr, j - 1, ok & (j > 0), HEADS, HEAD_SAMPLES,
                             KEY_BIAS, index)
    _, after = _sorted_pair(sorted_ptr, perm_ptr, j + 1, j + 1 < N, HEADS, HEAD_SAMPLES,
                            KEY_BIAS, index)
    # A dead sample's pair may pass int32 (a live one's does not): its cell tells.
    live = ok & (cell < CELLS)
    tl.store(bounds_ptr + pair, j.to(index), mask=live & ((j == 0) | (before != pair)))
    tl.store(bounds_ptr + CELLS * HEADS + pair, (j + 1).to(index),
             mask=live & ((j + 1 == N) | (after != pair)))


@triton.jit
def sorted_fill_kernel(sorted_ptr, perm_ptr, slot_records_ptr, records_ptr, bounds_ptr, N, CELLS,
                       HEADS, HEAD_SAMPLES, KEY_BIAS, BLOCK: tl.constexpr):
    """records[j] = slot_records[perm[j]] for j in [0, N): the records in
    the sort's order, one vector load and store each, and each bucket's
    bounds (_bucket_bounds) from the same entries.  Dead samples, sorted
    last, get records that no bucket reaches."""
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = j < N
    _bucket_bounds(sorted_ptr, perm_ptr, bounds_ptr, j, ok, N, CELLS, HEADS, HEAD_SAMPLES,
                   KEY_BIAS)
    slot = tl.load(perm_ptr + j, mask=ok, other=0).to(tl.int64)
    words = tl.load(_record_ptrs(slot_records_ptr, slot[:, None]), mask=ok[:, None, None])
    tl.store(_record_ptrs(records_ptr, j[:, None]), words, mask=ok[:, None, None])
