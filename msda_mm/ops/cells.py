"""Where a sample falls: its live mask and cell on the level's grid
(kernels.py's bilinear set-up), and its bucket for the deterministic
backward's counting sort (bucket_kernels.py), which msda_bwd_kernel ranks
while it computes the location and weight gradients."""
import triton
import triton.language as tl


@triton.jit
def _cell(x, y, H, W, active):
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
def _ext_start(l, shapes_ptr, L: tl.constexpr):
    """Where level l's extended grid starts among a head's cells: the sum of
    (H_j+1) * (W_j+1) over the levels j < l (int64, l's shape)."""
    start = tl.zeros(l.shape, dtype=tl.int64)
    for j in tl.static_range(L - 1):
        h = tl.load(shapes_ptr + 2 * j).to(tl.int64)
        w = tl.load(shapes_ptr + 2 * j + 1).to(tl.int64)
        start += tl.where(j < l, (h + 1) * (w + 1), 0)
    return start


@triton.jit
def _sample_bucket(x, y, l, H, W, inside, b, m, CELLS, shapes_ptr, L: tl.constexpr):
    """A [BLOCK_Q, BLOCK_P] tile of samples (locations x, y on levels l of
    H x W, [1, BLOCK_P] each): live (in a bucket), bucket (int64), and the
    bilinear fractions lx, ly.  A cell outside [0, CELLS) (shapes that do
    not tile value) is no bucket.  Grid dim 1 is M."""
    live, x0, y0, lx, ly = _cell(x, y, H, W, inside)
    cell = (_ext_start(l, shapes_ptr, L)[None, :] + (y0 + 1).to(tl.int64) * (W + 1)
            + (x0 + 1))
    live &= (cell >= 0) & (cell < CELLS)
    bucket = (b.to(tl.int64) * tl.num_programs(1) + m) * CELLS + cell
    return live, bucket, lx, ly


@triton.jit
def _sample_slot(p0, b, m, q, Q, L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr):
    """Each sample's slot ([BLOCK_Q, BLOCK_P], int64) in the per-sample
    (B, M, Q * L*K) arrays: points p0 .. p0 + BLOCK_P of queries q."""
    sample = q.to(tl.int64)[:, None] * (L * K) + (p0 + tl.arange(0, BLOCK_P))[None, :]
    head = b.to(tl.int64) * tl.num_programs(1) + m
    return head * Q * (L * K) + sample


@triton.jit
def _rank_samples(x, y, l, H, W, inside, p0, b, m, q, Q, CELLS, shapes_ptr, ranks_ptr,
                  counts_ptr, L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr):
    """The counting sort's first pass over a tile of samples
    (_sample_bucket): each live one's rank among its bucket's samples, an
    atomic increment of counts[1 + bucket] (counts zero-filled, of ranks'
    dtype), stored at its slot (_sample_slot) of ranks."""
    live, bucket, _, _ = _sample_bucket(x, y, l, H, W, inside, b, m, CELLS, shapes_ptr, L)
    rank = tl.atomic_add(counts_ptr + 1 + bucket, 1, mask=live, sem="relaxed")
    tl.store(ranks_ptr + _sample_slot(p0, b, m, q, Q, L, K, BLOCK_P), rank, mask=live)


@triton.jit
def _record_words(q, w, lx, ly, BITS: tl.constexpr):
    """A [BLOCK_Q, BLOCK_P] tile's records as [BLOCK_Q, BLOCK_P, 4] words of
    BITS (int32 for fp32 w, lx, ly, int64 for fp64): query, and the bits of
    w, lx and ly.  Joined, not selected: the four words are one thread's, so
    that each record is one vector store (STG.E.128 for int32 words)."""
    query = tl.broadcast_to(q[:, None], w.shape).to(BITS)
    words = tl.join(tl.join(query, lx.to(BITS, bitcast=True)),
                    tl.join(w.to(BITS, bitcast=True), ly.to(BITS, bitcast=True)))
    return tl.reshape(words, [w.shape[0], w.shape[1], 4])


@triton.jit
def _record_fields(words, ACC: tl.constexpr):
    """_record_words' inverse: query (int64), w, lx, ly (ACC)."""
    ql, wy = tl.split(tl.reshape(words, [words.shape[0], words.shape[1], 2, 2]))
    q, lx = tl.split(ql)
    w, ly = tl.split(wy)
    return (q.to(tl.int64), w.to(ACC, bitcast=True), lx.to(ACC, bitcast=True),
            ly.to(ACC, bitcast=True))


@triton.jit
def _record_ptrs(records_ptr, entry):
    """[..., 4] pointers to the records of entries ``entry``: (N, 4) words."""
    return records_ptr + entry[:, :, None] * 4 + tl.arange(0, 4)[None, None, :]


@triton.jit
def _key_samples(x, y, l, H, W, inside, w, p0, b, m, q, Q, CELLS, KEY_BIAS, shapes_ptr, keys_ptr,
                 records_ptr, L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr):
    """The stable sort's input from a tile of samples (_sample_bucket), each
    at its slot (_sample_slot): its key, its cell in its head plus KEY_BIAS
    (CELLS + KEY_BIAS, past every cell, where it is not live), and where
    live its record (_record_words) of weight w (ACC)."""
    live, bucket, lx, ly = _sample_bucket(x, y, l, H, W, inside, b, m, CELLS, shapes_ptr, L)
    slot = _sample_slot(p0, b, m, q, Q, L, K, BLOCK_P)
    head = (b.to(tl.int64) * tl.num_programs(1) + m) * CELLS
    key = tl.where(live, bucket - head, CELLS) + KEY_BIAS
    tl.store(keys_ptr + slot, key.to(keys_ptr.dtype.element_ty), mask=inside)
    tl.store(_record_ptrs(records_ptr, slot),
             _record_words(q, w, lx, ly, records_ptr.dtype.element_ty), mask=live[:, :, None])
