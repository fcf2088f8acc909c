"""inf, NaN and huge inputs on every path against msda_reference in fp64
(autograd): the forward (msda_fwd_kernel, and msda_fwd_pairs_kernel for
16-bit values), the default backward with the fp32 and the native
accumulator, the deterministic backward with each sort, and the fused
softmax.  Every output and gradient entry is finite exactly where the
reference's, rounded to its dtype, is, and close to it there
(docs/determinism.md, "Non-finite values"); the counting sort's inf and NaN
entries are the fp32 accumulator's, kind for kind, and bitwise the same
whatever the queries' order.  The reference itself samples zero at
locations far outside every level (1e38, inf, NaN), as the kernels do."""
import pytest
import torch
from test_msda_deterministic import assert_equal, permuted

from msda_mm.ops.tiles import SORTS, tile_override

from fixed_point_reference import fixed_point_grad_value
from msda_inputs import (
    FLOAT_INPUTS,
    FLOOR,
    logit_inputs,
    make_inputs,
    reference_fn,
    rel_err,
    run_op,
    softmax_reference,
)

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
SHAPES = ((3, 4), (2, 2))
NAMES = ("output",) + tuple(f"grad_{k}" for k in FLOAT_INPUTS)
INF, NAN = float("inf"), float("nan")


def _inputs(dtype, softmax=False):
    """B = 1, Q = 4, M = 2, D = 4, levels 3 x 4 and 2 x 2, K = 2, every
    location inside its level; and a grad_output (1, 4, 8)."""
    make = logit_inputs if softmax else make_inputs
    args = make(B=1, Q=4, M=2, D=4, shapes=SHAPES, K=2, dtype=dtype, lo=0.0, hi=1.0, seed=0)[0]
    g = torch.randn(1, 4, 8, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(1)).to(dtype)
    return args, g


def _paths(dtype):
    """(name, the op's keywords, tile_override's): every backward the op has
    for dtype, those after the first with msda_fwd_pairs_kernel's forward
    for 16-bit values."""
    pairs = dict(pairs=(4, 1)) if dtype in (torch.float16, torch.bfloat16) else {}
    if dtype != torch.float64:  # fp64 values accumulate in fp64
        yield "fp32 accumulator", dict(fp32_grad_accum=True), {}
    if dtype != torch.bfloat16:  # the interpreter has no bf16 atomics
        yield "native atomics", dict(fp32_grad_accum=False), pairs
    for sort in SORTS:
        yield f"{sort} sort", dict(deterministic=True), dict(pairs, sort=sort)


def _reference(args, g, reference=reference_fn):
    """Output and gradients of the fp64 reference, in NAMES' order."""
    f64 = {k: (v.double() if k in FLOAT_INPUTS else v) for k, v in args.items()}
    out, grads, _ = run_op(f64, fn=reference, grad_out=g.double())
    return [out] + [grads[k] for k in FLOAT_INPUTS]


def _run(args, g, kw, tiles):
    with tile_override(**tiles):
        out, grads, _ = run_op(args, grad_out=g, **kw)
    return [out] + [grads[k] for k in FLOAT_INPUTS]


def _assert_like_reference(path, got, want):
    """Each tensor finite exactly where the reference rounded to its dtype
    is, and there within its dtype's rounding floor (msda_inputs.FLOOR) of
    it: the finite entries are the same sums as without inf and NaN."""
    for name, x, ref in zip(NAMES, got, want):
        finite = ref.to(x.dtype).isfinite()
        wrong = (x.isfinite() != finite).nonzero().tolist()
        assert not wrong, f"{path}: {name}'s finiteness is not the reference's at {wrong}"
        # Scaled first: the norms of fp64 entries near 1e308 would overflow.
        scale = ref[finite].abs().max() if finite.any() else 1.0
        err = rel_err(x[finite].double() / scale, ref[finite] / scale)
        assert err <= FLOOR[x.dtype], f"{path}: {name} rel err {err:.3g}"


def _check_every_path(args, g, dtype, reference=reference_fn, **kw):
    want = _reference(args, g, reference)
    for path, op_kw, tiles in _paths(dtype):
        _assert_like_reference(path, _run(args, g, dict(kw, **op_kw), tiles), want)
    return want


def _nan_weight(args, g):
    args["attention_weights"][0, 1, 0, 0, 0] = NAN


def _inf_weights(args, g):
    args["attention_weights"][0, 1, 0, 0, 0] = INF
    args["attention_weights"][0, 3, 1, 1, 1] = -INF


def _inf_grad_output(args, g):
    g[0, 2, 1] = INF  # query 2, head 0, channel 1
    g[0, 0, 6] = -INF  # query 0, head 1, channel 2
    args["attention_weights"][0, 0, 1, 1, 0] = 0.0  # a term 0 * inf


def _nan_grad_output(args, g):
    g[0, 1, 5] = NAN


def _both_infinities(args, g):
    # An inf weight and a -inf grad_output in one head: rows both reach are NaN.
    args["attention_weights"][0, 1, 0, 0, 1] = INF
    g[0, 3, 0] = -INF


def _non_finite_values(args, g):
    args["value"][0, 5, 0, 1] = INF
    args["value"][0, 13, 1, 3] = -INF
    args["value"][0, 2, 1, 0] = NAN


def _outside_locations(args, g):
    # Locations outside their level: NaN, inf, the dtype's largest and finite
    # ones, in (query, head)s whose grad_output or weights hold inf or NaN:
    # such a sample's location gradient is 0 x inf, NaN, on every path.
    loc, w = args["sampling_locations"], args["attention_weights"]
    big = torch.finfo(loc.dtype).max
    loc[0, 1, 0, 0, 0, 0] = NAN
    loc[0, 1, 0, 1, 1, 1] = INF
    loc[0, 2, 1, 0, 1, 0] = big
    loc[0, 2, 1, 1, 0, 1] = -big
    loc[0, 3, 0, 0, 1, 0] = -0.6
    g[0, 1, 2] = INF
    g[0, 2, 6] = NAN
    w[0, 3, 0, 0, 1] = INF


CASES = [_nan_weight, _inf_weights, _inf_grad_output, _nan_grad_output, _both_infinities,
         _non_finite_values, _outside_locations]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda f: f.__name__[1:])
def test_every_path_is_finite_where_the_reference_is(case, dtype):
    args, g = _inputs(dtype)
    case(args, g)
    want = _check_every_path(args, g, dtype)
    assert any((~t.isfinite()).any() for t in want)


def _huge_grad_output(args, g):
    """g scaled so that the reference's largest gradient for the inputs'
    magnitudes is half dtype's largest float: as large as the float sums
    take, and the counting sort's bound, Q x the largest query's max |g| x
    sum |w|, passes 2**127 for fp32 and bf16 (2**1023 for fp64)."""
    abs_args = {k: (v.abs() if k in FLOAT_INPUTS else v) for k, v in args.items()}
    largest = max(t.abs().max() for t in _reference(abs_args, g.abs()))
    return (g.double() * (torch.finfo(g.dtype).max / 2 / largest)).to(g.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_huge_gradients_stay_finite(dtype):
    args, g = _inputs(dtype)
    g = _huge_grad_output(args, g)
    want = _check_every_path(args, g, dtype)
    assert all(t.to(dtype).isfinite().all() for t in want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_softmax_is_finite_where_the_reference_is(dtype):
    args, g = _inputs(dtype, softmax=True)
    logits = args["attention_weights"]
    logits[0, 0, 0, 0, 0] = INF  # the head's weights NaN (inf - inf)
    logits[0, 1, 1, 1, 1] = NAN
    logits[0, 2, 0] = -INF  # all -inf: NaN, as torch's softmax
    logits[0, 3, 1, 0, 1] = -INF  # weight 0
    g[0, 3, 6] = INF
    _check_every_path(args, g, dtype, reference=softmax_reference, softmax=True)


def _float_sums(args, g):
    """grad_value by float atomics of the same terms: fp32 ones (fp64 for fp64 values)."""
    fp32 = args["value"].dtype != torch.float64
    return run_op(args, grad_out=g, fp32_grad_accum=fp32)[1]["value"]


def _counting(args, g):
    with tile_override(sort="counting"):
        return run_op(args, grad_out=g, deterministic=True)[1]["value"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", [_nan_weight, _inf_weights, _inf_grad_output, _both_infinities],
                         ids=lambda f: f.__name__[1:])
def test_counting_sort_gives_the_fp32_accumulators_inf_and_nan(case, dtype):
    # Its inf and NaN terms summed apart in float: the entries the float sums
    # make inf, -inf or NaN are those, the others the fixed point's, bitwise.
    args, g = _inputs(dtype)
    case(args, g)
    got = _counting(args, g)
    want = _float_sums(args, g)
    for kind in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(kind(got), kind(want)), kind.__name__
    assert not got.isfinite().all()
    exact = fixed_point_grad_value(args["value"], args["spatial_shapes"],
                                   args["sampling_locations"], args["attention_weights"], g)
    assert_equal(got, exact)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_counting_sort_with_inf_and_nan_is_bitwise_the_same_in_any_query_order(dtype):
    args, g = _inputs(dtype)
    _inf_grad_output(args, g)
    _nan_weight(args, g)
    _both_infinities(args, g)
    first = _counting(args, g)
    perm = torch.tensor([2, 0, 3, 1])
    assert_equal(_counting(*permuted(args, g, perm)), first)
    assert first.isnan().any() and first.isinf().any()


@pytest.mark.parametrize("bad", [1e38, -1e38, INF, -INF, NAN])
def test_reference_samples_zero_far_outside_every_level(bad):
    # fp32: 1e38 * W overflowed grid_sample's pixel coordinate, which gave NaN.
    # A location outside its level weighs as a zero weight, bitwise; and the
    # kernels agree, also where grad_output is inf (location gradient 0 x inf).
    args, g = _inputs(torch.float32)
    args["sampling_locations"][0, 1, 0, 0, 0, 0] = bad
    args["sampling_locations"][0, 2, 1, 1, 1, 1] = bad
    zeroed = dict(args, attention_weights=args["attention_weights"].clone())
    zeroed["attention_weights"][0, 1, 0, 0, 0] = 0.0
    zeroed["attention_weights"][0, 2, 1, 1, 1] = 0.0
    out, grads, _ = run_op(args, fn=reference_fn, grad_out=g)
    want_out, want, _ = run_op(zeroed, fn=reference_fn, grad_out=g)
    assert_equal(out, want_out)
    assert_equal(grads["value"], want["value"])
    assert_equal(grads["sampling_locations"], want["sampling_locations"])
    for p in ((0, 1, 0, 0, 0), (0, 2, 1, 1, 1)):
        assert torch.count_nonzero(grads["sampling_locations"][p]) == 0
    g[0, 1, 2] = INF
    g[0, 2, 7] = INF
    _check_every_path(args, g, torch.float32)
