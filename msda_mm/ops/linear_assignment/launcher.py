"""linear_assignment: checks its inputs and launches the kernel, one program
per problem, without reading anything back to the host."""
from __future__ import annotations

import torch

from ..runtime import device_guard, next_pow2
from .kernel import linear_assignment_kernel
from .validate import check_kernel_call, check_problems


def linear_assignment(cost: torch.Tensor, num_cols: torch.Tensor) -> torch.Tensor:
    """Minimum-cost matching of the columns of each problem to distinct rows.

    Args:
        cost: (P, N, G) float16/bfloat16/float32 (solved in fp32): P problems
            of N rows (queries) and G columns (GT slots, padded to one cap),
            N >= G, any strides.
        num_cols: (P,) int32/int64 on cost's device: how many of the G
            columns of each problem are real (values outside [0, G] are
            clamped); the others are padding and stay unassigned.  Never
            read on the host.

    Returns:
        (P, G) int64: the row assigned to each column, -1 for padding
        columns.  The total cost equals scipy's linear_sum_assignment on
        each problem's (N, num_cols[p]) block, up to fp32 rounding (ties may
        resolve otherwise).  NaN costs count as +inf (scipy refuses NaN),
        and a problem with no assignment of finite cost (which scipy
        refuses) still gets a full valid matching.

    No host synchronisation: a call can be captured in a CUDA graph.
    """
    check_problems(cost, num_cols)
    check_kernel_call(cost)
    P, N, G = cost.shape
    out = torch.empty((P, G), dtype=torch.int64, device=cost.device)
    if P == 0 or G == 0:
        return out
    # The kernel keeps its state in registers and the row potentials here
    # too, where a search step reads one row's with a scalar load.
    row_potentials = torch.empty((P, N), dtype=torch.float32, device=cost.device)
    block_n = next_pow2(N)
    with device_guard(cost):
        # One warp per 256 rows (8 a thread): no spills up to MAX_ROWS.
        linear_assignment_kernel[(P,)](
            cost, num_cols, out, row_potentials, N, G, *cost.stride(), *out.stride(),
            BLOCK_N=block_n, num_warps=min(16, max(1, block_n // 256)))
    return out
