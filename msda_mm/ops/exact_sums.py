"""The deterministic backward's grad_value for fp16/bf16 value: each value
row summed in fp32 from integer-valued terms, which makes the fp32 additions
exact and so their order irrelevant (fp32 and fp64 values keep the int64
fixed point of fixed_point.py).

Per head a unit 2**p > bound / Q, the largest over its queries of
g_q * sum |w| (launch.grad_value_bound; g_q = max_d |grad_output| of query
q), so that every entry's |c| * g_q < 2**p (c its corner weight).  A first
pass over a row's entries sums u >= |c| * g_q * 2**(20-p), integers of at
most 2**20 + 1 each, in int64: S < 2**n.  Then every channel's
|sum of c * go| <= R = S * 2**(p-20) < 2**(n+p-20), and the row's exponent
e = 42 - n - p puts each term c * go * 2**e under 2**22.  The second pass
rounds each term to an integer, fma(c * 2**(e+k), go * 2**-k, MAGIC) -
MAGIC with k the query's exponent (the split keeps both factors normal);
|t| <= 2 |term|, so every partial sum is an integer under 2**23 and exact
in fp32, whatever tl.sum's tree and the chunk order.  The row is the sum
times 2**-e, rounded once to value's dtype."""
import triton
import triton.language as tl

from .fixed_point import _exponent, _pow2, _round_to

# fma(a, b, MAGIC) - MAGIC is a * b rounded to an integer (ties to even)
# wherever |a * b| <= 2**22: the sum lies in [2**23, 2**24], where fp32's
# spacing is 1.
MAGIC = tl.constexpr(1.5 * 2**23)
# The first pass's integers: 2**20 units of 2**(p-20) per entry at most.
UNIT_BITS = tl.constexpr(20)
# The rows' terms stay under 2**TERM_BITS (MAGIC's limit).
TERM_BITS = tl.constexpr(22)
# Scaled weights past this belong to queries without gradient (g_q = 0,
# where the bound says nothing about c): finite, so that 0 * c stays 0;
# every other scaled weight is under 2**45.
C_MAX = tl.constexpr(2.0**64)


@triton.jit
def _times_pow2(v, k):
    """v (fp32) * 2**k, k (int32) clamped to [-252, 254] and applied as two
    normal factors.  Exact unless the result is subnormal, and where a
    clamp applies the result rounds to the same integer terms (0)."""
    k = tl.minimum(tl.maximum(k, -252), 254)
    half = k >> 1
    return v * _pow2(half, tl.float32) * _pow2(k - half, tl.float32)


@triton.jit
def _query_exponent(g):
    """k with g < 2**k for g >= 0 (fp32), clamped to [-126, 126], so that
    2**-k is normal and g * 2**-k < 8."""
    return tl.minimum(tl.maximum(_exponent(g), -126), 126)


@triton.jit
def _head_unit(bound, Q_LOG2):
    """p with bound / Q < 2**p: bound < 2**ex (float64, the head's) and
    2**Q_LOG2 <= Q, no division; clamped to [-300, 130] (a larger p only
    coarsens a tiny head's first pass)."""
    return tl.minimum(tl.maximum(_exponent(bound) - Q_LOG2, -300), 130)


@triton.jit
def _scaled_weight(c, kq, shift):
    """c * 2**(shift + kq) (per entry), bounded by C_MAX."""
    return tl.minimum(tl.maximum(_times_pow2(c, shift + kq), -C_MAX), C_MAX)


@triton.jit
def _row_units(c, g, p):
    """The first pass's integers u >= |c| * g * 2**(20-p) (int64): the
    product of two factors, each rounding once, raised by 2**-22 > 2 ulps."""
    kq = _query_exponent(g)
    # The tensor first: the interpreter keeps constexpr - tensor a constexpr.
    cs = _scaled_weight(tl.abs(c), kq, -p + UNIT_BITS)
    gs = g * _pow2(-kq, tl.float32)
    return tl.ceil(cs * gs * (1.0 + 2.0**-22)).to(tl.int64)


@triton.jit
def _row_exponent(units, p):
    """The row's e from its sum of units (int64): units < 2**n, e = 42 - n - p,
    capped at 252 (rows that small are 0 in 16 bits)."""
    n = _exponent(tl.maximum(units, 1).to(tl.float32))
    return tl.minimum(-n - p + (UNIT_BITS + TERM_BITS), 252)


@triton.jit
def _integer_terms(c, g, go, e):
    """c * go * 2**e rounded to integers (fp32): c [BLOCK_S, BLOCK_E] with
    its queries' g, go [BLOCK_S, BLOCK_E, BLOCK_D], e [BLOCK_S]."""
    kq = _query_exponent(g)
    cs = _scaled_weight(c, kq, e[:, None])
    gos = go * _pow2(-kq, tl.float32)[:, :, None]
    return tl.fma(cs[:, :, None], gos, MAGIC) - MAGIC


@triton.jit
def _integers_to_float(acc, e, ok, ty: tl.constexpr):
    """The rows' integer sums acc (fp32, [BLOCK_S, BLOCK_D]) times 2**-e
    (exact but for subnormals), rounded once to ty; NaN where not ok."""
    return _round_to(tl.where(ok, _times_pow2(acc, -e[:, None]), float("nan")), ty)
