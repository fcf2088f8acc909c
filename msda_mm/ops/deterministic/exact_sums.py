"""The deterministic backward's terms for fp16/bf16 values (fp32 arithmetic):
each rounded to an integer in one FFMA, without a float-to-integer
conversion (F2I, 16 a clock an SM on sm_90 against 128 FFMAs), and summed in
int32 (fixed_point.py gives the rows their exponents).

A row of n < 2**N entries takes e = T - X with T = min(22, 31 - N)
(fixed_point.row_exponent; X its largest |c| * g_q < 2**X), so every term
c * go * 2**e is under 2**T <= 2**22, and fma(c * 2**(e+k), go * 2**-k, MAGIC)
holds it rounded to an integer in its low bits: the float's bits minus
MAGIC's are that integer, |t| <= 2**T.  Every partial sum of the row is then
at most n * 2**T < 2**31: int32 adds them exactly, in any order.  Rows of up
to 511 entries (the encoder's average 64, the decoders' one) keep 22 bits of
their largest term, fuller ones 31 - N, against the 11 and 8 of fp16 and
bf16."""
import triton
import triton.language as tl

from .fixed_point import scaled_factors

# fma(a, b, MAGIC) is MAGIC plus a * b rounded to an integer (ties to even)
# wherever |a * b| <= 2**22: the sum lies in [2**23, 2**24], where fp32's
# spacing is 1 and the bits count up by one per integer.
MAGIC = tl.constexpr(1.5 * 2**23)
MAGIC_BITS = tl.constexpr(0x4B400000)
# The terms stay under 2**TERM_BITS (MAGIC's limit), a row's sum under 2**SUM_BITS (int32).
TERM_BITS = tl.constexpr(22)
SUM_BITS = tl.constexpr(31)


@triton.jit
def integer_terms(c, g, go, e):
    """c * go * 2**e rounded to integers (int32) for fixed_point.row_exponent's
    e with TERM_BITS and SUM_BITS: c [BLOCK_S, BLOCK_E] with its queries' g,
    go [BLOCK_S, BLOCK_E, BLOCK_D], e [BLOCK_S]."""
    cs, gos = scaled_factors(c, g, go, e)
    return tl.fma(cs, gos, MAGIC).to(tl.int32, bitcast=True) - MAGIC_BITS
