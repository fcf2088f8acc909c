"""Where a sample falls for the deterministic backward's sorts: its bucket
and its slot, which msda_bwd_kernel takes while it computes the location
and weight gradients: the counting sort's ranks (rank_samples) or the
stable sort's keys and records (key_samples).

A live sample (b, q, m, l, k) (sampling.sample_cell) has its top-left
bilinear corner (y0, x0) in [-1, H_l-1] x [-1, W_l-1]: its cell on level
l's extended grid of (H_l+1) x (W_l+1).  Its bucket is
(b*M + m) * CELLS + ext_start_l + (y0+1) * (W_l+1) + (x0+1), ext_start_l the
extended grids of the levels before l; dead samples go in no bucket."""
import triton
import triton.language as tl

from ..sampling import sample_cell
from .records import record_ptrs, record_words


@triton.jit
def ext_start(l, shapes_ptr, L: tl.constexpr):
    """Where level l's extended grid starts among a head's cells: the sum of
    (H_j+1) * (W_j+1) over the levels j < l (int64, l's shape)."""
    start = tl.zeros(l.shape, dtype=tl.int64)
    for j in tl.static_range(L - 1):
        h = tl.load(shapes_ptr + 2 * j).to(tl.int64)
        w = tl.load(shapes_ptr + 2 * j + 1).to(tl.int64)
        start += tl.where(j < l, (h + 1) * (w + 1), 0)
    return start


@triton.jit
def sample_bucket(x, y, l, H, W, inside, b, m, CELLS, shapes_ptr, L: tl.constexpr):
    """A [BLOCK_Q, BLOCK_P] tile of samples (locations x, y on levels l of
    H x W, [1, BLOCK_P] each): live (in a bucket), bucket (int64), and the
    bilinear fractions lx, ly.  A cell outside [0, CELLS) (shapes that do
    not tile value) is no bucket.  Grid dim 1 is M."""
    live, x0, y0, lx, ly = sample_cell(x, y, H, W, inside)
    cell = (ext_start(l, shapes_ptr, L)[None, :] + (y0 + 1).to(tl.int64) * (W + 1)
            + (x0 + 1))
    live &= (cell >= 0) & (cell < CELLS)
    bucket = (b.to(tl.int64) * tl.num_programs(1) + m) * CELLS + cell
    return live, bucket, lx, ly


@triton.jit
def sample_slot(p0, b, m, q, Q, L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr):
    """Each sample's slot ([BLOCK_Q, BLOCK_P], int64) in the per-sample
    (B, M, Q * L*K) arrays: points p0 .. p0 + BLOCK_P of queries q."""
    sample = q.to(tl.int64)[:, None] * (L * K) + (p0 + tl.arange(0, BLOCK_P))[None, :]
    head = b.to(tl.int64) * tl.num_programs(1) + m
    return head * Q * (L * K) + sample


@triton.jit
def rank_samples(x, y, l, H, W, inside, p0, b, m, q, Q, CELLS, shapes_ptr, ranks_ptr,
                  counts_ptr, L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr):
    """The counting sort's first pass over a tile of samples
    (sample_bucket): each live one's rank among its bucket's samples, an
    atomic increment of counts[1 + bucket] (counts zero-filled, of ranks'
    dtype), stored at its slot (sample_slot) of ranks."""
    live, bucket, _, _ = sample_bucket(x, y, l, H, W, inside, b, m, CELLS, shapes_ptr, L)
    rank = tl.atomic_add(counts_ptr + 1 + bucket, 1, mask=live, sem="relaxed")
    tl.store(ranks_ptr + sample_slot(p0, b, m, q, Q, L, K, BLOCK_P), rank, mask=live)


@triton.jit
def key_samples(x, y, l, H, W, inside, w, p0, b, m, q, Q, CELLS, KEY_BIAS, shapes_ptr, keys_ptr,
                 records_ptr, L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr):
    """The stable sort's input from a tile of samples (sample_bucket), each
    at its slot (sample_slot): its key, its cell in its head plus KEY_BIAS
    (CELLS + KEY_BIAS, past every cell, where it is not live), and where
    live its record (record_words) of weight w (ACC)."""
    live, bucket, lx, ly = sample_bucket(x, y, l, H, W, inside, b, m, CELLS, shapes_ptr, L)
    slot = sample_slot(p0, b, m, q, Q, L, K, BLOCK_P)
    head = (b.to(tl.int64) * tl.num_programs(1) + m) * CELLS
    key = tl.where(live, bucket - head, CELLS) + KEY_BIAS
    tl.store(keys_ptr + slot, key.to(keys_ptr.dtype.element_ty), mask=inside)
    tl.store(record_ptrs(records_ptr, slot),
             record_words(q, w, lx, ly, records_ptr.dtype.element_ty), mask=live[:, :, None])
