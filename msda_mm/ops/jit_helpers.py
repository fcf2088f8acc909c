"""The @triton.jit helpers that kernels of several paths share: a program's
batch, head and queries (grid: query blocks, M, B) with its tile's masks,
pointers into (B, Q, M, ...) and (B, S, M, D) tensors, a chunk's points,
and two 16-bit channels as one int32 word."""
import triton
import triton.language as tl


@triton.jit
def row_ptrs(base, idx, stride_s, offs_d, stride_d):
    """[BLOCK_Q, BLOCK_D] pointers to rows idx (a [BLOCK_Q] vector)."""
    return base + idx.to(tl.int64)[:, None] * stride_s + (offs_d * stride_d)[None, :]


@triton.jit
def head_base(ptr, b, m, stride_b, stride_m):
    return ptr + b.to(tl.int64) * stride_b + m.to(tl.int64) * stride_m


@triton.jit
def point_ptrs(ptr, b, q, m, l, k, stride_b, stride_q, stride_m, stride_l, stride_k):
    """[BLOCK_Q, BLOCK_P] pointers to element (b, q, m, l, k) of a
    (B, Q, M, L, K, ...) tensor."""
    return (head_base(ptr, b, m, stride_b, stride_m) + q.to(tl.int64)[:, None] * stride_q
            + (l * stride_l + k * stride_k)[None, :])


@triton.jit
def program_queries(Q, BLOCK_Q: tl.constexpr):
    """This program's batch b, head m and [BLOCK_Q] queries with their mask
    (grid: query blocks, M, B)."""
    q = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    return tl.program_id(2), tl.program_id(1), q, q < Q


@triton.jit
def program_tile(Q, D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's batch b, head m, [BLOCK_Q] queries and [BLOCK_D] head
    channels, with their bounds masks.  Grid (query blocks, M, B): query
    blocks vary fastest, so that neighbouring programs sample neighbouring
    rows of the same head, and no program divides its id (a flat grid cost
    4 integer divisions, ~50 of 904 SASS instructions of the bf16 forward)."""
    b, m, q, qmask = program_queries(Q, BLOCK_Q)
    offs_d = tl.arange(0, BLOCK_D)
    return b, m, q, qmask, offs_d, offs_d < D


@triton.jit
def chunk_points(p0, L: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr):
    """Points p0 .. p0 + BLOCK_P of the flattened (L, K) axis: their level l,
    point k and bounds mask ([BLOCK_P] each)."""
    p = p0 + tl.arange(0, BLOCK_P)
    pmask = p < L * K
    return tl.where(pmask, p // K, 0), p % K, pmask


@triton.jit
def pair_halves(raw, HALF: tl.constexpr):
    """Words of two HALF values (int32 for fp16/bf16, int64 for fp32): the
    low and the high ones, in fp32."""
    if HALF == tl.float32:
        lo = raw.to(tl.int32).to(tl.float32, bitcast=True)
        hi = (raw >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    elif HALF == tl.bfloat16:
        # A bf16 is the high half of an fp32: one shift or one and per value,
        # where a bf16 -> fp32 conversion took 1.5 instructions on sm_90.
        lo = (raw << 16).to(tl.float32, bitcast=True)
        hi = (raw & -65536).to(tl.float32, bitcast=True)
    else:
        lo = raw.to(tl.int16).to(HALF, bitcast=True).to(tl.float32)
        hi = (raw >> 16).to(tl.int16).to(HALF, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def pair_words(lo, hi, HALF: tl.constexpr):
    """pair_halves' inverse: fp32 lo and hi rounded to HALF, as its words."""
    if HALF == tl.float32:
        return ((lo.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF)
                | (hi.to(tl.int32, bitcast=True).to(tl.int64) << 32))
    else:
        return ((lo.to(HALF).to(tl.int16, bitcast=True).to(tl.int32) & 65535)
                | (hi.to(HALF).to(tl.int16, bitcast=True).to(tl.int32) << 16))
