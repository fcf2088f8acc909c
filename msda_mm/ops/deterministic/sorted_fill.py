"""The deterministic backward's stable sort, for value rows of 2 entries or
more (Tiles.deterministic_sort): the buckets of cells.py with their
entries in sample order, so that grad_value_gather_kernel can sum them in
float, in that order, in one pass.

msda_bwd_kernel stores each sample's cell in its head (its key: 16 bits
where the cells allow, so that the radix sort makes two passes, not four)
and its record (records.record_words) at its slot, where it reads the
sample's location and weight (cells.key_samples); a stable radix sort
(torch.sort) orders the samples by cell and then by slot, whose order is
head by head: by (cell, head, slot), each bucket (head, cell) contiguous.
sorted_fill_kernel finds where each bucket starts and ends in that order
and moves each entry's record there.
Nothing depends on the order in which programs run: the same entries in the
same order every run.
"""
import triton
import triton.language as tl

from .records import record_ptrs


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
    words = tl.load(record_ptrs(slot_records_ptr, slot[:, None]), mask=ok[:, None, None])
    tl.store(record_ptrs(records_ptr, j[:, None]), words, mask=ok[:, None, None])
