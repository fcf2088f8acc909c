"""The deterministic backward's counting sort (value rows of few entries,
Tiles.deterministic_sort), all on the device: msda_bwd_kernel ranks each
sample in its bucket (cells.py) with an atomic increment
(cells.rank_samples) while it computes the location and weight gradients,
an exclusive cumsum of the counts gives each bucket's first entry, and
bucket_fill_kernel writes each sample's record (its query, attention
weight and bilinear fractions: records.py) to its entry.  The order inside
a bucket varies run to run; the gather's integer sums (gather.py)
do not depend on it."""
import triton
import triton.language as tl

from ..jit_helpers import chunk_points, point_ptrs, program_queries
from .cells import sample_bucket, sample_slot
from .records import record_ptrs, record_words


@triton.jit
def _sample_buckets(p0, b, m, q, qmask, Q, CELLS, shapes_ptr, loc_ptr,
                    stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
                    L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr, ACC: tl.constexpr):
    """Chunk p0's samples ([BLOCK_Q, BLOCK_P]) as msda_bwd_kernel ranked
    them: live, bucket (cells.sample_bucket), slot (cells.sample_slot),
    bilinear fractions lx, ly, l and k."""
    l, k, pmask = chunk_points(p0, L, K, BLOCK_P)
    inside = qmask[:, None] & pmask[None, :]
    H = tl.load(shapes_ptr + 2 * l).to(tl.int32)[None, :]
    W = tl.load(shapes_ptr + 2 * l + 1).to(tl.int32)[None, :]
    lp = point_ptrs(loc_ptr, b, q, m, l, k, stride_lb, stride_lq, stride_lm, stride_ll,
                     stride_lk)
    x = tl.load(lp, mask=inside, other=0.0).to(ACC)
    y = tl.load(lp + stride_lc, mask=inside, other=0.0).to(ACC)
    live, bucket, lx, ly = sample_bucket(x, y, l, H, W, inside, b, m, CELLS, shapes_ptr, L)
    return live, bucket, sample_slot(p0, b, m, q, Q, L, K, BLOCK_P), lx, ly, l, k


@triton.jit
def _sample_records(p0, b, m, q, qmask, Q, CELLS, shapes_ptr, loc_ptr, attn_ptr,
                    stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
                    stride_ab, stride_aq, stride_am, stride_al, stride_ak,
                    L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr, ACC: tl.constexpr,
                    BITS: tl.constexpr):
    """Chunk p0's samples as _sample_buckets gives them (live, bucket, slot)
    and their records (record_words, of BITS), the attention weight read
    where live."""
    live, bucket, slot, lx, ly, l, k = _sample_buckets(
        p0, b, m, q, qmask, Q, CELLS, shapes_ptr, loc_ptr, stride_lb, stride_lq, stride_lm,
        stride_ll, stride_lk, stride_lc, L, K, BLOCK_P, ACC)
    w = tl.load(point_ptrs(attn_ptr, b, q, m, l, k, stride_ab, stride_aq, stride_am,
                            stride_al, stride_ak), mask=live, other=0.0).to(ACC)
    return live, bucket, slot, record_words(q, w, lx, ly, BITS)


@triton.jit
def bucket_fill_kernel(
    shapes_ptr, loc_ptr, attn_ptr, ranks_ptr, offsets_ptr, records_ptr, Q, CELLS,
    stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
    stride_ab, stride_aq, stride_am, stride_al, stride_ak,
    L: tl.constexpr, K: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_P: tl.constexpr,
    ACC: tl.constexpr,
):
    """Each live sample's record at its entry offsets[bucket] + rank (ranks
    from msda_bwd_kernel, offsets the exclusive cumsum of the counts), one
    vector store of records (N, 4) (record_words): its query, attention
    weight w and bilinear fractions lx, ly, in ACC, from which the gather
    recomputes each corner weight bitwise as msda_bwd_kernel does
    (sampling.bilinear_weight).  Grid: (cdiv(Q, BLOCK_Q), M, B)."""
    b, m, q, qmask = program_queries(Q, BLOCK_Q)
    for p0 in range(0, L * K, BLOCK_P):
        live, bucket, slot, words = _sample_records(
            p0, b, m, q, qmask, Q, CELLS, shapes_ptr, loc_ptr, attn_ptr,
            stride_lb, stride_lq, stride_lm, stride_ll, stride_lk, stride_lc,
            stride_ab, stride_aq, stride_am, stride_al, stride_ak, L, K, BLOCK_P, ACC,
            records_ptr.dtype.element_ty)
        rank = tl.load(ranks_ptr + slot, mask=live, other=0)
        entry = (tl.load(offsets_ptr + bucket, mask=live, other=0) + rank).to(tl.int64)
        tl.store(record_ptrs(records_ptr, entry), words, mask=live[:, :, None])
