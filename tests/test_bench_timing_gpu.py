"""The benchmark's device timers on a GPU (run: python -m pytest -m gpu tests)."""
import pytest
import torch

from bench.op.timing import graph_floor_us, graph_times_us, kernel_times_us

pytestmark = pytest.mark.gpu


def test_kernel_time_counts_each_call_once_and_leaves_out_the_graph_launch():
    x = torch.zeros(1 << 24, device="cuda")  # 64 MB: each fill is ~20 us of DRAM writes
    one = kernel_times_us(lambda: x.fill_(1.0), x.device)
    two = kernel_times_us(lambda: (x.fill_(1.0), x.fill_(2.0)), x.device)
    assert 0 < one and two == pytest.approx(2 * one, rel=0.25)
    # The graph timer of the same call adds at least its launch.
    assert graph_times_us(lambda: x.fill_(1.0), x.device, 20)[0] > one
    assert 0 < graph_floor_us(x.device, 20) < 50


def test_kernel_time_refuses_calls_that_launch_a_varying_number_of_kernels():
    x = torch.zeros(16, device="cuda")
    calls = iter(range(100))
    with pytest.raises(RuntimeError, match="not one group per call"):
        kernel_times_us(lambda: [x.add_(1) for _ in range(next(calls) % 2 + 1)], x.device)
