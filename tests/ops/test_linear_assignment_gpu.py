"""linear_assignment on the GPU at DINO's sizes (run: python -m pytest -m gpu
tests): 8 images x 7 matched outputs of 900 queries, scipy's total cost on
every problem, no host synchronisation, and a CUDA graph of it replayed on
new costs."""
import pytest
import torch

from bench.matching.costs import dino_like_costs
from bench.op.timing import capture_graph
from msda_mm.ops.linear_assignment import linear_assignment

from assignment_checks import assert_optimal

pytestmark = pytest.mark.gpu

P, N = 56, 900


@pytest.mark.parametrize("G", [20, 60, 100])
def test_dino_sizes_give_scipys_total_without_host_sync(G):
    cost, num_cols = dino_like_costs(P, N, G, seed=G, device="cuda")
    linear_assignment(cost, num_cols)  # compiles outside the sync check
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = linear_assignment(cost, num_cols)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_optimal(cost, num_cols, out)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_costs_at_dino_size(dtype):
    cost, num_cols = dino_like_costs(P, N, 100, seed=1, device="cuda", dtype=dtype)
    assert_optimal(cost, num_cols, linear_assignment(cost, num_cols))


def test_transposed_cost_buffer():
    """Rows contiguous (a (P, G, N) buffer's view): the kernel specialised on
    stride 1 along the rows."""
    cost, num_cols = dino_like_costs(P, N, 100, seed=2, device="cuda")
    cost = cost.transpose(1, 2).contiguous().transpose(1, 2)
    assert_optimal(cost, num_cols, linear_assignment(cost, num_cols))


def test_cuda_graph_replays_on_new_costs():
    cost, num_cols = dino_like_costs(P, N, 100, seed=3, device="cuda")
    static_cost, static_cols = cost.clone(), num_cols.clone()
    graph, static_out = capture_graph(lambda: linear_assignment(static_cost, static_cols))

    fresh_cost, fresh_cols = dino_like_costs(P, N, 100, seed=4, device="cuda")
    static_cost.copy_(fresh_cost)
    static_cols.copy_(fresh_cols)
    graph.replay()
    assert_optimal(fresh_cost, fresh_cols, static_out)
