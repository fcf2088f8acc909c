"""The deterministic backward's fixed point, one exponent per value row
(gather.grad_value_gather_kernel): each of a row's n entries adds
c * go (c its corner weight, go its query's grad_output row) times 2**e,
rounded to an integer, and the integers are summed exactly, so that their
order does not matter; the sum times 2**-e is rounded once to value's dtype.

The gather's first pass over a row's entries takes n and X, the largest
entry_exponent (|c| * g_q < 2**X, g_q = max_d |grad_output| of the entry's
query, which the bound kernel stores): a max, exact and order-free.  With
n < 2**N, e = T - X (row_exponent) puts every term under 2**T and every
partial sum under n * 2**T <= 2**B: fp32 and fp64 values truncate their
terms in ACC and sum them in int64 (B = 63, T = 63 - N: 63 - N bits of the
row's own largest term, whatever the head's other rows hold); 16-bit values
round theirs in one FFMA and sum them in int32 (exact_sums.py).  The scale is
applied as c * 2**(e + k_q) and go * 2**-k_q (scaled_factors, g_q < 2**k_q):
neither overflows, and one is subnormal only in a term under 2**-62, which
is 0 either way.  Nothing overflows for any finite input: the result is inf
only where the exact sum passes value's dtype.  g_q is the max over the
query's finite channels, so that inf or NaN elsewhere in its grad_output
leave its finite terms their scale; the terms with a factor inf or NaN are
summed apart (nonfinite.py) in heads whose bound (buckets.grad_value_bound)
is not finite (head_finite)."""
import triton
import triton.language as tl

from ..jit_helpers import head_base

# A row's int64 sum stays under 2**FIXED_BITS.
FIXED_BITS = tl.constexpr(63)
# X of a row without entries: below every entry's (>= -2044, fp64's smallest).
NO_ENTRY = tl.constexpr(-(2**14))
# Scaled weights past this belong to queries without gradient (g_q = 0, where
# nothing bounds c): finite, so that c * 0 stays 0.  Every other one is under
# 2**115 (scaled_factors) and any product with a factor < 4 stays finite in fp32.
C_MAX = tl.constexpr(2.0**120)


@triton.jit
def _pow2(e, ACC: tl.constexpr):
    """2**e in ACC (fp32 or fp64), built from its bits: e (int) must lie in
    ACC's normal range."""
    if ACC == tl.float64:
        return ((e.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)
    else:
        return ((e.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _exponent(x):
    """ex (int32) with x < 2**ex for every float x >= 0 (fp32 or fp64), from
    its exponent field: 0 and subnormals get 1 - BIAS (the smallest normal
    exponent), inf and NaN BIAS + 2."""
    if x.dtype == tl.float64:
        return (((x.to(tl.int64, bitcast=True) >> 52) & 2047) - 1022).to(tl.int32)
    else:
        return ((x.to(tl.int32, bitcast=True) >> 23) & 255) - 126


@triton.jit
def _times_pow2(v, k):
    """v (fp32 or fp64) * 2**k, k (int32) clamped to [2 - 2 BIAS, 2 BIAS] and
    applied as two normal factors: exact unless the result is subnormal.  The
    kernels' k lie inside the clamp wherever the result can be nonzero."""
    LIMIT: tl.constexpr = 1022 if v.dtype == tl.float64 else 126
    k = tl.minimum(tl.maximum(k, -2 * LIMIT), 2 * LIMIT + 2)
    half = k >> 1
    return v * _pow2(half, v.dtype) * _pow2(k - half, v.dtype)


@triton.jit
def _query_exponent(g):
    """k_q with g < 2**k_q for g >= 0, clamped to [1 - BIAS, BIAS - 1] so that
    2**-k_q is normal: g * 2**-k_q < 1 (< 4 at the upper clamp)."""
    LIMIT: tl.constexpr = 1022 if g.dtype == tl.float64 else 126
    return tl.minimum(tl.maximum(_exponent(g), -LIMIT), LIMIT)


@triton.jit
def entry_exponent(c, g, live):
    """X (int32) with |c| * g < 2**X for each live entry (corner weight c, its
    query's g, both ACC), NO_ENTRY where not live: the exponent of the
    rounded |c| * (g * 2**-k_q), which bounds the exact product (rounding is
    monotone), plus k_q.  (X is no bound where c is inf or NaN: every term
    of such an entry is inf or NaN, summed apart.)"""
    BIAS: tl.constexpr = 1023 if g.dtype == tl.float64 else 127
    kq = _query_exponent(g)
    x = _exponent(tl.abs(c) * (g * _pow2(-kq, g.dtype)))
    # g * 2**-k_q < 4: near the largest floats the product overflows (x = BIAS + 2,
    # inf's) where it is under 2**(BIAS + 3).
    x += (x > BIAS + 1).to(tl.int32)
    return tl.where(live, x + kq, NO_ENTRY)


@triton.jit
def scaled_factors(c, g, go, e):
    """c * 2**(e + k_q) ([BLOCK_S, BLOCK_E, 1]) and go * 2**-k_q ([BLOCK_S,
    BLOCK_E, BLOCK_D]), whose product is each term times 2**e: c [BLOCK_S,
    BLOCK_E] with its queries' g, go [BLOCK_S, BLOCK_E, BLOCK_D], e [BLOCK_S].
    For e = T - X, |c| * 2**(e + k_q) < 2**(T + 1) where g >= 2**(k_q - 1), and
    2**(T + 53) for subnormal g: under 2**115 (C_MAX bounds the queries with
    g = 0)."""
    kq = _query_exponent(g)
    cs = _times_pow2(c, e[:, None] + kq)
    cs = tl.minimum(tl.maximum(cs, -C_MAX), C_MAX)
    return cs[:, :, None], go * _pow2(-kq, g.dtype)[:, :, None]


@triton.jit
def row_exponent(X, n, TERM_BITS: tl.constexpr, SUM_BITS: tl.constexpr):
    """e (int32) for a row of n entries whose terms are each under 2**X: every
    term times 2**e is under 2**T, T = min(TERM_BITS, SUM_BITS - N) with
    n < 2**N, so that, rounded or truncated to integers |t| <= 2**T, every
    partial sum of them is at most n * 2**T < 2**SUM_BITS."""
    N = _exponent(tl.maximum(n, 1).to(tl.float32))
    # The tensor first: the interpreter keeps constexpr - tensor a constexpr.
    return tl.minimum(-N + SUM_BITS, TERM_BITS) - X


@triton.jit
def fixed_point_terms(c, g, go, e):
    """c * go * 2**e truncated to integers (int64), for row_exponent's e with
    FIXED_BITS (shapes as scaled_factors)."""
    cs, gos = scaled_factors(c, g, go, e)
    return (cs * gos).to(tl.int64)


@triton.jit
def head_bound(bound_ptr, b, m):
    """Head (b, m)'s entry of the (B, M) float64 bound (grid dim 1 is M)."""
    return tl.load(head_base(bound_ptr, b, m, tl.num_programs(1), 1))


@triton.jit
def head_finite(bound):
    """Whether the head's float64 bound is finite, so that no term has an
    inf or NaN factor: none in its grad_output or attention weights (fp64
    inputs whose bound passes fp64's range also say no; the gather's pass
    for such terms then finds none)."""
    return bound < float("inf")


@triton.jit
def _round_to(x, ty: tl.constexpr):
    """x (fp32 or fp64) rounded to the nearest ty, ties to even.  bf16 from
    fp32 bits, where the interpreter would truncate (a plain .to() there drops
    the low 16 bits; compiled, both are the same round to nearest)."""
    if ty == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.int32, bitcast=True)
        bits += 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(ty)


@triton.jit
def fixed_to_float(acc, e, ty: tl.constexpr, ACC: tl.constexpr):
    """The rows' int64 sums acc ([BLOCK_S, BLOCK_D]) at exponents e ([BLOCK_S])
    as ty: acc * 2**-e.  Only the int64 -> ACC conversion rounds, then the
    store's (and a subnormal or overflowing result)."""
    return _round_to(_times_pow2(acc.to(ACC), -e[:, None]), ty)
