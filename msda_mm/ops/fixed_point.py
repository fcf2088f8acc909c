"""The deterministic backward's int64 fixed point (kernels.py's module
docstring): the exponent per (batch, head) from its bound, the terms as
integers, and the sums back to a float."""
import triton
import triton.language as tl

from .kernels import _head_base


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
    its exponent field: 0 and subnormals get the smallest normal exponent
    plus 1, inf and NaN the largest plus 2."""
    if x.dtype == tl.float64:
        return (((x.to(tl.int64, bitcast=True) >> 52) & 2047) - 1022).to(tl.int32)
    else:
        return ((x.to(tl.int32, bitcast=True) >> 23) & 255) - 126


@triton.jit
def _head_bound(bound_ptr, b, m):
    """Head (b, m)'s entry of the (B, M) float64 bound (grid dim 1 is M)."""
    return tl.load(_head_base(bound_ptr, b, m, tl.num_programs(1), 1))


@triton.jit
def _fixed_point_exponent(bound, ACC: tl.constexpr):
    """A head's fixed-point exponent e and whether it has one: bound is the
    head's float64 bound on |every partial sum| of its grad_value
    (_head_bound).  e is the largest with bound * 2**e < 2**61, capped at
    2 * (BIAS - 1): the scale is applied as two factors 2**(e // 2) and
    2**(e - e // 2), each with a normal inverse, so that a bound as small as
    ACC's subnormals still gets 61 bits.  ok is False, and e 0, where the
    bound is inf, NaN or 2**BIAS or more (a term or the result could
    overflow ACC): that head's grad_value is NaN."""
    BIAS: tl.constexpr = 1023 if ACC == tl.float64 else 127
    # The sums then stay under 2**62 while the bound is less than 2x short
    # (its fp32 weight sums and the terms' roundings: ~L*K*2**-24), clear of
    # int64's 2**63.
    BITS: tl.constexpr = 61
    ex = _exponent(bound)
    ok = ex <= BIAS
    return tl.where(ok, tl.minimum(BITS - ex, 2 * BIAS - 2), 0), ok


@triton.jit
def _fixed_point_terms(c, go, e, ACC: tl.constexpr):
    """What the deterministic gather sums: c * go * 2**e truncated to an
    integer (int64), 2**e applied as two factors (see _fixed_point_exponent),
    both exact."""
    half = e >> 1
    return (c * go * _pow2(half, ACC) * _pow2(e - half, ACC)).to(tl.int64)


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
def _fixed_to_float(acc, e, ok, ty: tl.constexpr, ACC: tl.constexpr):
    """Fixed-point sums acc (int64) at exponent e as ty: acc * 2**-e, NaN
    where the head has no fixed point (ok False).  Two factors, as in
    _fixed_point_terms: exact, so that only the int64 -> ACC conversion rounds
    (and a subnormal result)."""
    half = e >> 1
    out = acc.to(ACC) * _pow2(-half, ACC) * _pow2(half - e, ACC)
    return _round_to(tl.where(ok, out, float("nan")), ty)
