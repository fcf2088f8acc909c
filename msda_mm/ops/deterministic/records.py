"""A sample's record for the deterministic backward's gather: four words
holding its query and the bits of its attention weight w and bilinear
fractions lx, ly, from which the gather recomputes each corner weight
bitwise as msda_bwd_kernel does (sampling.bilinear_weight)."""
import torch
import triton
import triton.language as tl


def record_dtype(acc_dtype) -> torch.dtype:
    """The words of a record holding acc_dtype's bits: int32 for fp32, int64
    for fp64."""
    return torch.int64 if acc_dtype is tl.float64 else torch.int32


@triton.jit
def record_words(q, w, lx, ly, BITS: tl.constexpr):
    """A [BLOCK_Q, BLOCK_P] tile's records as [BLOCK_Q, BLOCK_P, 4] words of
    BITS (int32 for fp32 w, lx, ly, int64 for fp64): query, and the bits of
    w, lx and ly.  Joined, not selected: the four words are one thread's, so
    that each record is one vector store (STG.E.128 for int32 words)."""
    query = tl.broadcast_to(q[:, None], w.shape).to(BITS)
    words = tl.join(tl.join(query, lx.to(BITS, bitcast=True)),
                    tl.join(w.to(BITS, bitcast=True), ly.to(BITS, bitcast=True)))
    return tl.reshape(words, [w.shape[0], w.shape[1], 4])


@triton.jit
def record_fields(words, ACC: tl.constexpr):
    """record_words' inverse: query (int64), w, lx, ly (ACC)."""
    ql, wy = tl.split(tl.reshape(words, [words.shape[0], words.shape[1], 2, 2]))
    q, lx = tl.split(ql)
    w, ly = tl.split(wy)
    return (q.to(tl.int64), w.to(ACC, bitcast=True), lx.to(ACC, bitcast=True),
            ly.to(ACC, bitcast=True))


@triton.jit
def record_ptrs(records_ptr, entry):
    """[..., 4] pointers to the records of entries ``entry``: (N, 4) words."""
    return records_ptr + entry[:, :, None] * 4 + tl.arange(0, 4)[None, None, :]
