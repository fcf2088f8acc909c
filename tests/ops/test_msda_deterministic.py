"""The deterministic backward in the interpreter, with each sort (the
``sort`` fixture): bitwise-identical gradients whatever the launch order,
accuracy against fp64; the counting sort's fixed point: its scale, its
independence of the queries' order, finite at the top of fp32's range;
with either sort non-finite terms reach only their own rows (more on inf
and NaN: test_msda_nonfinite.py).  The same properties
at realistic shapes on the GPU: test_msda_deterministic_gpu.py."""
import pytest
import torch

from msda_mm.ops.backward.launcher import launch_backward
from msda_mm.ops.deterministic.buckets import grad_value_bound
from msda_mm.ops.tiles import Tiles, tile_override

from msda_inputs import FLOAT_INPUTS, FLOOR, make_inputs, reference_fn, rel_err, run_op

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# One rounding of the stored 16-bit result: the fixed-point and the fp32
# sums differ in their last fp32 bits, and a 16-bit result may round to the
# neighbour.
ONE_ROUNDING = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def _crowded(dtype, seed=0, **kw):
    """Small inputs whose locations crowd near the image centre, so that many
    samples add to the same grad_value rows."""
    return make_inputs(B=1, Q=6, M=2, D=4, shapes=((4, 5), (2, 3)), K=2, dtype=dtype,
                       lo=0.4, hi=0.6, seed=seed, **kw)[0]


def permuted(args, grad_out, perm):
    """The same call with the queries in order ``perm``."""
    out = dict(args, sampling_locations=args["sampling_locations"][:, perm],
               attention_weights=args["attention_weights"][:, perm])
    M = args["value"].shape[2]
    return out, grad_out.unflatten(-1, (M, -1))[:, perm].flatten(-2)


def assert_equal(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_runs_and_tiles_give_bitwise_identical_gradients(dtype, sort):
    args = _crowded(dtype)
    _, first, g = run_op(args, deterministic=True)
    # Repeats, then other tiles (BLOCK_Q x warps x BLOCK_P: other programs
    # own each query, other chunks each point).
    tiles = [None] * 3 + [(1, 1, 1), (1, 1, 2), (2, 1, 4), (4, 2, 2), (8, 1, 16)]
    for tile in tiles:
        with tile_override(bwd=tile):
            _, grads, _ = run_op(args, grad_out=g, deterministic=True)
        for k in first:
            assert_equal(grads[k], first[k])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_counting_sort_gives_grad_value_bitwise_whatever_the_query_order(dtype):
    # Integer sums: the queries reversed add the same integers.  (The stable
    # sort sums in sample order, which follows the queries'.)
    args = _crowded(dtype)
    with tile_override(sort="counting"):
        _, first, g = run_op(args, deterministic=True)
        perm = torch.arange(args["attention_weights"].shape[1]).flip(0)
        perm_args, perm_g = permuted(args, g, perm)
        _, grads, _ = run_op(perm_args, grad_out=perm_g, deterministic=True)
    assert_equal(grads["value"], first["value"])
    # Written once per element, never added to: each is its query's own.
    assert_equal(grads["sampling_locations"], first["sampling_locations"][:, perm])
    assert_equal(grads["attention_weights"], first["attention_weights"][:, perm])


def test_float_atomics_do_depend_on_the_query_order():
    # What the test above rules out: the fp32 atomics of the default backward
    # add the reversed queries' terms in another order, with other roundings.
    args = _crowded(torch.float32)
    _, first, g = run_op(args)
    perm = torch.arange(args["attention_weights"].shape[1]).flip(0)
    perm_args, perm_g = permuted(args, g, perm)
    _, grads, _ = run_op(perm_args, grad_out=perm_g)
    torch.testing.assert_close(grads["value"], first["value"])
    assert not torch.equal(grads["value"], first["value"])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_locations_and_weights_gradients_are_the_default_backwards(dtype, sort):
    # The deterministic mode changes grad_value's accumulation only.
    args = _crowded(dtype, seed=1)
    _, det, g = run_op(args, deterministic=True)
    _, default, _ = run_op(args, grad_out=g, fp32_grad_accum=True)
    for k in ("sampling_locations", "attention_weights"):
        assert_equal(det[k], default[k])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_stable_sort_sums_a_strided_grad_output_as_a_contiguous_one(dtype):
    # A contiguous 16-bit grad_output is read as int32 words of two channels, a
    # strided one channel by channel: the same terms in fp32, one rounding apart.
    args = _crowded(dtype, seed=2)
    gen = torch.Generator().manual_seed(2)
    wide = torch.randn(1, 6, 16, dtype=torch.float64, generator=gen).to(dtype)
    inputs = [args["value"], args["spatial_shapes"], args["sampling_locations"],
              args["attention_weights"]]
    stable = Tiles(sort="stable")
    strided = launch_backward(wide[..., ::2], *inputs, False, True, tiles=stable)[0]
    packed = launch_backward(wide[..., ::2].contiguous(), *inputs, False, True, tiles=stable)[0]
    scale = packed.abs().max().item()
    torch.testing.assert_close(strided, packed, rtol=ONE_ROUNDING[dtype],
                               atol=ONE_ROUNDING[dtype] * scale)
    assert packed.abs().sum() > 0


def worst_row_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest relative error of a grad_value row (b, s, m) that the
    reference has nonzero: small rows count as much as large ones."""
    x, ref = x.detach().cpu().double(), ref.detach().cpu().double()
    norms = ref.norm(dim=-1)
    return ((x - ref).norm(dim=-1)[norms > 0] / norms[norms > 0]).max().item()


def errors(args, grad_out, metric=rel_err):
    """grad_value's error (``metric``) against the fp64 reference (on the
    CPU): (deterministic, fp32 accumulator), both on args' device."""
    f64 = {k: (v.cpu().double() if k in FLOAT_INPUTS else v.cpu()) for k, v in args.items()
           if v is not None}
    _, truth, _ = run_op(dict(f64, level_start_index=None), fn=reference_fn,
                         grad_out=grad_out.cpu().double())
    _, det, _ = run_op(args, grad_out=grad_out, deterministic=True)
    _, fp32, _ = run_op(args, grad_out=grad_out, fp32_grad_accum=True)
    return metric(det["value"], truth["value"]), metric(fp32["value"], truth["value"])


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grad_value_is_no_less_accurate_than_the_fp32_accumulator(dtype, seed, sort):
    args = _crowded(dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(1, 6, 8, dtype=torch.float64, generator=gen).to(dtype)
    det, fp32 = errors(args, g)
    # The stable sort's fp32 sums round where the atomics' do, in another order.
    assert det <= fp32 + ONE_ROUNDING.get(dtype, 2.0**-24 if sort == "stable" else 0.0), (
        det, fp32, seed)
    assert det <= FLOOR[dtype], (det, seed)


def mixed_sizes(g, spread, seed):
    """grad_output g (B, Q, C) with each query scaled by 2**i, i uniform in
    [-spread / 2, spread / 2]."""
    gen = torch.Generator().manual_seed(seed)
    powers = torch.randint(-spread // 2, spread // 2 + 1, (1, g.shape[1], 1), generator=gen)
    return (g.double() * 2.0**powers.to(g.device)).to(g.dtype)


@pytest.mark.parametrize("dtype,spread", [(torch.bfloat16, 40), (torch.float16, 20),
                                          (torch.float32, 40)], ids=str)
def test_rows_of_small_queries_are_as_accurate_as_with_the_fp32_accumulator(dtype, spread,
                                                                            sort):
    # Queries 2**spread apart, few samples a row: a row that only small
    # queries reach gets its own exponent and keeps every bit a row of the
    # large ones keeps; one exponent for the head would leave it spread / 2
    # of the terms' bits fewer.
    args = make_inputs(B=1, Q=12, M=2, D=4, shapes=((4, 5), (2, 3)), K=2, dtype=dtype,
                       lo=0.0, hi=1.0, seed=6)[0]
    g = mixed_sizes(torch.randn(1, 12, 8, dtype=torch.float64,
                                generator=torch.Generator().manual_seed(6)).to(dtype), spread, 6)
    det, fp32 = errors(args, g, worst_row_err)
    # A row may round once the other way (fp32: 2**-24 of it).
    assert det <= fp32 + ONE_ROUNDING.get(dtype, 2.0**-24), (det, fp32)


@pytest.mark.parametrize("dtype,spread", [(torch.bfloat16, 40), (torch.float16, 20),
                                          (torch.float32, 40), (torch.float64, 80)], ids=str)
def test_rows_far_below_their_heads_largest_term_keep_their_own_precision(dtype, spread,
                                                                          sort):
    # One head, fp32 locations and weights as under AMP, queries 2**spread
    # apart (fp16: 2**20, its range): a row whose terms add up to 2**-39 of the
    # largest row's keeps the precision the fp32 accumulator gives it.
    side = None if dtype == torch.float64 else torch.float32
    args = make_inputs(B=1, Q=12, M=1, D=4, shapes=((4, 5), (2, 3)), K=2, dtype=dtype,
                       loc_dtype=side, attn_dtype=side, lo=0.0, hi=1.0, seed=7)[0]
    g = mixed_sizes(torch.randn(1, 12, 4, dtype=torch.float64,
                                generator=torch.Generator().manual_seed(7)).to(dtype), spread, 7)
    det, fp32 = errors(args, g, worst_row_err)
    if dtype == torch.float64:
        # The fp32 scratch is no yardstick for fp64: its exact sums of fp64
        # terms differ from the reference by the latter's order of operations.
        assert det <= FLOOR[dtype], det
    else:
        assert det <= fp32 + ONE_ROUNDING.get(dtype, 2.0**-24), (det, fp32)


@pytest.mark.parametrize("dtype,power", [(torch.float32, 100), (torch.float32, -100),
                                         (torch.bfloat16, 100), (torch.bfloat16, -100),
                                         (torch.float16, 8),
                                         (torch.float64, 900), (torch.float64, -900)], ids=str)
def test_the_scale_follows_grad_output_exactly(dtype, power, sort):
    # The fixed point's exponent comes from grad_output's size: the same terms
    # scaled by a power of two give the same integers, so grad_value scales
    # exactly; so do float sums, none over- or underflowing.  2**-100 needs
    # more than fp32's largest exponent (applied as two factors); 2**100 a
    # negative one.  (fp16 only upwards: downwards its small gradients would
    # turn subnormal and round differently; and a fixed draw, in which no
    # fp16 grad_value entry of the unscaled run is subnormal.)
    args = _crowded(dtype, seed=2)
    g = torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(2)).to(dtype)
    _, base, _ = run_op(args, grad_out=g, deterministic=True)
    _, scaled, _ = run_op(args, grad_out=g * 2.0**power, deterministic=True)
    assert_equal(scaled["value"], base["value"] * 2.0**power)


def _one_bad_grad_output(dtype, bad, sort):
    """Gradients with ``sort`` for clean grad_output and for it with ``bad``
    at query 2, head 1 (D = 4), channel 1, and the fp32 accumulator's for the
    latter: (clean, bad, default)."""
    args = _crowded(dtype, seed=3)
    g = torch.randn(1, 6, 8).to(dtype)
    with tile_override(sort=sort):
        _, clean, _ = run_op(args, grad_out=g, deterministic=True)
        g[0, 2, 5] = bad
        _, grads, _ = run_op(args, grad_out=g, deterministic=True)
    return clean, grads, run_op(args, grad_out=g, fp32_grad_accum=True)[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_terms_reach_their_rows_only(bad, dtype, sort):
    # As in the default backward's float sums: the rows a query with inf or
    # NaN in its grad_output reaches get inf or NaN in that channel, every
    # other element is what it was (the counting sort's finite terms keep
    # their scale, its inf and NaN ones are summed apart).
    clean, grads, default = _one_bad_grad_output(dtype, bad, sort)
    hit = ~grads["value"].isfinite()
    assert torch.equal(hit, ~default["value"].isfinite()) and hit.any()
    assert hit[:, :, 1, 1].any() and not hit[:, :, 0].any() and not hit[..., [0, 2, 3]].any()
    assert_equal(grads["value"][~hit], clean["value"][~hit])
    for k in ("sampling_locations", "attention_weights"):
        assert_equal(grads[k], default[k])


def test_nan_weight_and_a_bound_past_fp32_keep_to_their_rows(sort):
    args = _crowded(torch.float32, seed=4)
    args["attention_weights"][0, 3, 0, 1, 0] = float("nan")  # head 0
    g = torch.randn(1, 6, 8)
    # Head 1: |grad_output| up to 1e38, a bound past 2**127 (6 queries with
    # weights summing to ~2): the fixed point's scale still fits.
    g[..., 4:] *= 1e38 / g[..., 4:].abs().max()
    _, grads, _ = run_op(args, grad_out=g, deterministic=True)
    _, default, _ = run_op(args, grad_out=g, fp32_grad_accum=True)
    hit = grads["value"].isnan()
    assert torch.equal(hit, default["value"].isnan()) and hit[:, :, 0].any()
    assert grads["value"][:, :, 1].isfinite().all() and not hit[:, :, 0].all()
    f64 = {k: (v.double() if k in FLOAT_INPUTS else v) for k, v in args.items()}
    truth = run_op(f64, fn=reference_fn, grad_out=g.double())[1]["value"]
    assert rel_err(grads["value"][:, :, 1], truth[:, :, 1]) <= FLOOR[torch.float32]
    bound = grad_value_bound(g.unflatten(-1, (2, 4)), args["attention_weights"])
    assert bound[0, 0].isnan() and bound[0, 1] > 2.0**127


def test_bound_caps_every_partial_sum_and_ignores_query_order():
    args = _crowded(torch.float32, seed=5)
    g = torch.randn(1, 6, 8)
    bound = grad_value_bound(g.unflatten(-1, (2, 4)), args["attention_weights"])
    # Every term counted with its magnitude: the largest possible partial sum.
    f64 = {k: (v.double() if k in FLOAT_INPUTS else v) for k, v in args.items()}
    abs_args = dict(f64, attention_weights=f64["attention_weights"].abs())
    _, grads, _ = run_op(abs_args, fn=reference_fn, grad_out=g.double().abs())
    largest = grads["value"].amax(dim=(1, 3))  # (B, M)
    # Tight to 4 Q L K: the largest element takes a quarter (one corner) of
    # the heaviest sample of the query that sets the bound.
    assert (largest <= bound).all() and (bound <= 4 * 6 * 2 * 2 * largest).all(), (largest,
                                                                                  bound)
    perm = torch.randperm(6)
    assert_equal(grad_value_bound(g.unflatten(-1, (2, 4))[:, perm],
                                          args["attention_weights"][:, perm]), bound)
