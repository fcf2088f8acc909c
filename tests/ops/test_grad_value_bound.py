"""grad_value_bound_kernel (the deterministic backward's fixed-point bound)
in the interpreter against the bound's PyTorch formula, non-finite input
included."""
import pytest
import torch

from msda_mm.ops.deterministic.buckets import grad_value_bound

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def torch_bound(go, w):
    """Q * max_q max_d |go| * sum_{l,k} |w| in PyTorch ops (the sum in fp32 at least)."""
    go_max = torch.linalg.vector_norm(go, float("inf"), dim=-1)
    w_sum = torch.linalg.vector_norm(w, 1, dim=(-2, -1),
                                     dtype=torch.promote_types(w.dtype, torch.float32))
    return (go_max.double() * w_sum.double()).amax(1) * go.shape[1]


def _inputs(dtype, B=2, Q=70, M=3, D=5, L=2, K=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    go = torch.randn(B, Q, M, D, generator=g).to(dtype)
    w = (torch.rand(B, Q, M, L, K, generator=g) - 0.25).to(dtype)
    return go, w


def _close(bound, go, w):
    # Only the order of the L * K weights' sum differs: L * K roundings of the
    # sum's dtype (fp32, or fp64 for fp64 weights).
    eps = torch.finfo(torch.promote_types(w.dtype, torch.float32)).eps
    torch.testing.assert_close(bound, torch_bound(go, w), rtol=w[0, 0].numel() * eps, atol=0,
                               equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bound_kernel_matches_the_formula(dtype):
    go, w = _inputs(dtype)
    bound = grad_value_bound(go, w)
    assert bound.dtype == torch.float64 and bound.shape == (2, 3)
    _close(bound, go, w)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_bound_kernel_stores_each_querys_largest_grad_output(dtype):
    # The 16-bit gather's per-query scale: max_d |go|, exact in fp32.
    go, w = _inputs(dtype)
    query_max = torch.full(go.shape[:3], float("nan"))
    bound = grad_value_bound(go, w, query_max)
    torch.testing.assert_close(query_max, go.float().abs().amax(-1), rtol=0, atol=0)
    torch.testing.assert_close(bound, grad_value_bound(go, w), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_each_querys_scale_is_its_finite_channels_max(dtype):
    # The gather scales a query's finite terms by it, and sums its inf and NaN
    # terms apart; the bound still turns inf or NaN.
    go, w = _inputs(dtype)
    go[0, 5, 0, 2] = float("inf")
    go[1, 7, 1, 1] = -float("nan")
    go[1, 8, 2] = float("-inf")  # every channel: the scale is 0
    query_max = torch.full(go.shape[:3], float("nan"), dtype=torch.promote_types(
        dtype, torch.float32))
    bound = grad_value_bound(go, w, query_max)
    finite = torch.where(go.isfinite(), go.abs(), 0).to(query_max.dtype)
    torch.testing.assert_close(query_max, finite.amax(-1), rtol=0, atol=0)
    assert query_max[1, 8, 2] == 0 and query_max.isfinite().all()
    assert bound[0, 0].isinf() and bound[1, 1].isnan() and bound[1, 2].isinf()


def test_bound_kernel_takes_strided_inputs_and_one_query():
    go, w = _inputs(torch.float32, Q=1, D=40, L=3, K=5)
    _close(grad_value_bound(go, w), go, w)
    go, w = _inputs(torch.float32, Q=9)
    go_t = go.transpose(1, 2).contiguous().transpose(1, 2)  # (B, Q, M, D), Q-major strides
    w_t = w.permute(0, 1, 2, 4, 3).contiguous().permute(0, 1, 2, 4, 3)
    assert not go_t.is_contiguous() and not w_t.is_contiguous()
    _close(grad_value_bound(go_t, w_t), go, w)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_non_finite_inputs_make_only_their_heads_inf_or_nan(dtype):
    go, w = _inputs(dtype)
    go[0, 5, 0, 2] = float("inf")  # head (0, 0): inf
    go[0, 7, 1, 1] = -float("nan")  # head (0, 1): NaN, its sign bit set
    w[1, 3, 2, 0, 1] = float("nan")  # head (1, 2): NaN
    go[1, 4, 0, 0] = float("inf")  # head (1, 0): inf times zero weights is NaN
    w[1, 4, 0] = 0.0
    go[1, 6, 1, 0] = 1e30 if dtype == torch.float32 else 1e38  # head (1, 1): finite, huge
    bound = grad_value_bound(go, w)
    assert bound[0, 0].isinf() and bound[0, 1].isnan() and bound[1, 2].isnan()
    assert bound[1, 0].isnan() and bound[1, 1].isfinite() and bound[0, 2].isfinite()
    _close(bound, go, w)


def test_bound_is_bitwise_the_same_whatever_the_query_order():
    go, w = _inputs(torch.float32, Q=200)
    perm = torch.randperm(200, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(grad_value_bound(go[:, perm], w[:, perm]),
                               grad_value_bound(go, w), rtol=0, atol=0)
