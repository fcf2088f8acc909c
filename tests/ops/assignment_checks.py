"""What the linear-assignment tests check of a solution: a valid matching
(distinct rows in range on the real columns, -1 exactly on the padding
columns) whose total cost is scipy's, up to fp32 rounding."""
import numpy as np
import torch

from msda_mm.ops.linear_assignment import linear_assignment_reference

EPS32 = float(np.finfo(np.float32).eps)


def real_counts(cost: torch.Tensor, num_cols: torch.Tensor) -> list:
    return num_cols.cpu().clamp(0, cost.shape[2]).tolist()


def assert_valid_matching(cost: torch.Tensor, num_cols: torch.Tensor, out: torch.Tensor) -> None:
    P, N, G = cost.shape
    assert out.shape == (P, G) and out.dtype == torch.int64 and out.device == cost.device
    for p, (k, rows) in enumerate(zip(real_counts(cost, num_cols), out.cpu().tolist())):
        real, padding = rows[:k], rows[k:]
        assert all(0 <= r < N for r in real), (p, rows)
        assert len(set(real)) == k, f"problem {p}: a row matched twice: {rows}"
        assert padding == [-1] * (G - k), f"problem {p}: padding columns {k}.. matched: {rows}"


def totals(cost: torch.Tensor, num_cols: torch.Tensor, out: torch.Tensor) -> list:
    """Per problem, the float64 sum of the matched pairs' costs."""
    costs = cost.detach().cpu().double().numpy()
    rows = out.cpu().numpy()
    return [float(costs[p, rows[p, :k], np.arange(k)].sum())
            for p, k in enumerate(real_counts(cost, num_cols))]


def assert_optimal(cost: torch.Tensor, num_cols: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` is a valid matching of scipy's total cost on every problem."""
    assert_valid_matching(cost, num_cols, out)
    reference = linear_assignment_reference(cost, num_cols)
    costs = cost.detach().cpu().double().numpy()
    for p, (k, got, want) in enumerate(zip(real_counts(cost, num_cols), totals(cost, num_cols, out),
                                           totals(cost, num_cols, reference))):
        finite = costs[p, :, :k][np.isfinite(costs[p, :, :k])]
        # The kernel's matching is optimal for its fp32 reduced costs, each
        # within a few roundings at the potentials' magnitude (<= 2 max|c|)
        # of the exact one: its total may exceed the optimum by a few ulps
        # of max|c| per column.  Integer costs are exact (totals differ by
        # >= 1 otherwise, far above this).
        tol = 16 * k * EPS32 * float(np.abs(finite).max(initial=0.0))
        assert abs(got - want) <= tol, (
            f"problem {p} ({k} columns): total {got!r}, scipy's {want!r}, tolerance {tol:.3g}")
