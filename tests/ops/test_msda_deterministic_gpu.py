"""The deterministic backward on the GPU with each sort (the ``sort``
fixture), at realistic shapes where float atomics collide by the thousand
(run: python -m pytest -m gpu tests)."""
import pytest
import torch
from test_msda_deterministic import (
    ONE_ROUNDING,
    assert_equal,
    errors,
    mixed_sizes,
    permuted,
    worst_row_err,
)

from bench.op.timing import capture_graph
from msda_mm import multi_scale_deformable_attention as msda
from msda_mm.ops.tiles import tile_override

from msda_inputs import FLOAT_INPUTS, make_inputs, run_op

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
SHAPES = ((64, 80), (32, 40), (16, 20), (8, 10))


def _inputs(dtype, lo, hi, seed=0):
    """DINO-decoder-like call (900 queries, 8 heads of 32, 4 levels of 4
    points), locations uniform in [lo, hi] of every level; fp32 locations
    and weights except for fp64."""
    side = None if dtype == torch.float64 else torch.float32
    args, _ = make_inputs(B=2, Q=900, M=8, D=32, shapes=SHAPES, K=4, dtype=dtype,
                          loc_dtype=side, attn_dtype=side, lo=lo, hi=hi, seed=seed)
    return {k: (v.cuda() if v is not None else None) for k, v in args.items()}


def _one_pixel(dtype):
    # Every sample within a pixel of the widest level's centre: each of the
    # 2 x 8 heads' 57600 samples adds to the same few rows.
    return _inputs(dtype, 0.5, 0.5 + 1 / 80)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ten_runs_are_bitwise_identical(dtype, sort):
    args = _one_pixel(dtype)
    _, first, g = run_op(args, deterministic=True)
    assert first["value"].abs().amax() > 0
    for _ in range(9):
        _, grads, _ = run_op(args, grad_out=g, deterministic=True)
        for k in FLOAT_INPUTS:
            assert_equal(grads[k], first[k])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_tiles_give_bitwise_identical_grad_value(dtype, sort):
    args = _one_pixel(dtype)
    _, first, g = run_op(args, deterministic=True)
    for tile in [(1, 1, 4), (1, 1, 16), (2, 1, 8), (4, 1, 16), (4, 4, 8)]:
        with tile_override(bwd=tile):
            _, grads, _ = run_op(args, grad_out=g, deterministic=True)
        assert_equal(grads["value"], first["value"])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_counting_sort_gather_tiles_and_query_order_give_bitwise_identical_grad_value(dtype):
    args = _one_pixel(dtype)
    with tile_override(sort="counting"):
        _, first, g = run_op(args, deterministic=True)
        # The gather's (rows, warps, entries a step): other programs own each row.
        for tile in [(1, 1, 4), (2, 1, 8), (4, 4, 32)]:
            with tile_override(gather=tile):
                _, grads, _ = run_op(args, grad_out=g, deterministic=True)
            assert_equal(grads["value"], first["value"])
        perm = torch.randperm(900, device="cuda")
        permuted_args, permuted_g = permuted(args, g, perm)
        _, grads, _ = run_op(permuted_args, grad_out=permuted_g, deterministic=True)
    assert_equal(grads["value"], first["value"])
    assert_equal(grads["sampling_locations"], first["sampling_locations"][:, perm])
    assert_equal(grads["attention_weights"], first["attention_weights"][:, perm])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grad_value_is_no_less_accurate_than_the_fp32_accumulator(dtype, sort):
    # Locations crowded in [0.2, 0.4]: ~50 adds per touched element.
    args = _inputs(dtype, 0.2, 0.4, seed=1)
    g = torch.randn(2, 900, 256, device="cuda", dtype=torch.float64).to(dtype)
    det, fp32 = errors(args, g)
    # The stable sort's fp32 sums round where the atomics' do, in another order.
    assert det <= fp32 + ONE_ROUNDING.get(dtype, 2.0**-24 if sort == "stable" else 0.0), (
        det, fp32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_rows_of_small_queries_are_as_accurate_as_with_the_fp32_accumulator(dtype, sort):
    # Queries 2**40 apart (fp16: 2**20, its range), locations over the whole
    # image: rows that only small queries reach keep their own precision.
    args = _inputs(dtype, 0.0, 1.0, seed=4)
    g = torch.randn(2, 900, 256, device="cuda", dtype=torch.float64).to(dtype)
    g = mixed_sizes(g, 20 if dtype == torch.float16 else 40, seed=4)
    det, fp32 = errors(args, g, worst_row_err)
    assert det <= fp32 + ONE_ROUNDING.get(dtype, 2.0**-24), (det, fp32)


def test_cuda_graph_replays_the_deterministic_backward(sort):
    # No host synchronisation: the bound, the backward, the sort (counts,
    # cumsum, fill; keys, radix sort, starts, fill) and the gather all
    # capture, and replays give the eager gradients.
    args = _inputs(torch.bfloat16, 0.2, 0.4, seed=2)
    static = {k: (args[k].clone().requires_grad_() if k in FLOAT_INPUTS else args[k])
              for k in args}
    g = torch.randn(2, 900, 256, device="cuda", dtype=torch.bfloat16)

    def step():
        out = msda(**static, deterministic=True)
        return torch.autograd.grad(out, [static[k] for k in FLOAT_INPUTS], g)

    graph, captured = capture_graph(step)
    _, eager, _ = run_op(args, grad_out=g, deterministic=True)
    for _ in range(2):
        graph.replay()
        for k, got in zip(FLOAT_INPUTS, captured):
            assert_equal(got, eager[k])


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_grad_output_reaches_its_rows_only(bad, sort):
    # The inf or NaN elements are the fp32 accumulator's, kind for kind (the
    # counting sort's channel pass, compiled), every other one is what it was.
    args = _one_pixel(torch.float32)
    g = torch.randn(2, 900, 256, device="cuda")
    _, clean, _ = run_op(args, grad_out=g, deterministic=True)
    g[1, 7, 3 * 32 + 5] = bad  # batch 1, head 3, channel 5
    _, grads, _ = run_op(args, grad_out=g, deterministic=True)
    _, default, _ = run_op(args, grad_out=g, fp32_grad_accum=True)
    for kind in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(kind(grads["value"]), kind(default["value"])), kind.__name__
    hit = ~grads["value"].isfinite()
    assert hit[1, :, 3, 5].any() and hit.sum() == hit[1, :, 3, 5].sum()
    assert_equal(grads["value"][~hit], clean["value"][~hit])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_grad_value_scales_exactly_to_the_top_of_fp32(dtype, sort):
    # grad_output x 2**120: the counting sort's bound passes 2**127 (900
    # queries), its fixed point's scale still fits, and every sum scales exactly.
    args = _inputs(dtype, 0.0, 1.0, seed=5)
    g = torch.randn(2, 900, 256, device="cuda").to(dtype)
    _, base, _ = run_op(args, grad_out=g, deterministic=True)
    _, scaled, _ = run_op(args, grad_out=g * 2.0**120, deterministic=True)
    assert scaled["value"].isfinite().all()
    assert_equal(scaled["value"], base["value"] * 2.0**120)


def test_backward_on_a_user_stream_matches_the_default_stream(sort):
    # Every kernel of the deterministic backward (bound, sort, gather, the
    # location and weight gradients) runs on the caller's stream: work queued
    # after it there (here a copy) sees all three gradients.
    args = _inputs(torch.bfloat16, 0.2, 0.4, seed=3)
    _, first, g = run_op(args, deterministic=True)
    user = torch.cuda.Stream()
    user.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(user):
        _, grads, _ = run_op(args, grad_out=g, deterministic=True)
        copies = {k: v.clone() for k, v in grads.items()}
    torch.cuda.current_stream().wait_stream(user)
    for k in FLOAT_INPUTS:
        assert_equal(copies[k], first[k])
