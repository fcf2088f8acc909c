"""The counting sort's inf and NaN terms (gather.grad_value_gather_kernel):
integers carry neither, so a term c * go with an inf or NaN factor is
summed apart, in float, beside the exact sums of the others.

That sum holds only such terms (the finite ones count as 0): +inf, -inf or
NaN, and IEEE addition of those is associative and commutative (any NaN, or
both infinities, give NaN), so that it is bitwise the same in any order, as
the integer sums are.  Where it is not 0 it is the element's result, as a
float sum of all the terms makes it (the finite terms' exact sum is finite
and cannot turn an infinity finite).  Only the rows of a head whose
grad_output or attention weights hold inf or NaN (its bound is not finite:
fixed_point.head_finite) take it; their finite terms keep their scale (the
bound kernel's per-query scale is the max over the finite channels)."""
import triton
import triton.language as tl


@triton.jit
def nonfinite_terms(c, go):
    """c * go where c or go is inf or NaN, else 0 (tiles that broadcast):
    the factors decide, not the product, which may overflow where the
    exact term is finite."""
    finite = (tl.abs(c) < float("inf")) & (tl.abs(go) < float("inf"))
    return tl.where(finite, 0.0, c * go)
