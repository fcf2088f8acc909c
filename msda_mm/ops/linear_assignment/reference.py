"""The linear assignment by scipy, problem by problem on the host, in
linear_assignment's output format: what the kernel is tested against."""
from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from .validate import check_problems


def linear_assignment_reference(cost: torch.Tensor, num_cols: torch.Tensor) -> torch.Tensor:
    """(P, G) int64 on cost's device: scipy's matching of each problem's
    (N, num_cols[p]) block of cost (P, N, G) (num_cols clamped to [0, G]),
    in float64, NaN read as +inf; -1 for padding columns.  scipy's
    ValueError for a problem with no assignment of finite cost."""
    check_problems(cost, num_cols)
    P, N, G = cost.shape
    costs = cost.detach().cpu().double().numpy()  # exact upcast of fp16/bf16/fp32
    counts = num_cols.cpu().clamp(0, G).tolist()
    out = np.full((P, G), -1, dtype=np.int64)
    for p, k in enumerate(counts):
        block = np.where(np.isnan(costs[p, :, :k]), np.inf, costs[p, :, :k])
        rows, cols = linear_sum_assignment(block)
        out[p, cols] = rows
    return torch.from_numpy(out).to(cost.device)
