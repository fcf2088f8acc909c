"""The scatter ceiling: how fast this GPU can do the atomic row-adds an MSDA
backward does into grad_value, with none of the op's other work.

The backward's time goes to its scattered atomics (docs/design.md:
ncu saw the memory pipes 92.5% busy in the encoder's), plus the zero fill
of grad_value they add into.  ``scatter_add_kernel`` does exactly the
backward's atomics (one row-add per corner of every sample, at the rows
``gather.corner_rows`` names, in the op's tile shape and dtype) and nothing
else: no gathers, no location math, no location or weight gradients.  Its
time plus the fill's is a floor for the backward's, for this access pattern.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from msda_mm.ops.backward.zero_fill import fill_zeros
from research.gather import check_row_tile


def zeroed(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.zeros through the backward's own fill (fill_zeros)."""
    out = torch.empty(shape, dtype=dtype, device=device)
    fill_zeros(out)
    return out


@triton.jit
def scatter_add_kernel(grad_ptr, rows_ptr, src_ptr, N, R: tl.constexpr, D: tl.constexpr,
                       BLOCK_Q: tl.constexpr, BLOCK_R: tl.constexpr):
    """grad_rows[rows[n, r], :] += src[n, :] for every r, BLOCK_Q outputs n
    per program, BLOCK_R rows at a time, with relaxed atomics in grad's
    dtype; grad rows (D contiguous elements), rows (N, R) int32, src (N, D).
    Grid: cdiv(N, BLOCK_Q)."""
    n = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    nmask = n < N
    d = tl.arange(0, D)
    src = tl.load(src_ptr + n.to(tl.int64)[:, None] * D + d[None, :], mask=nmask[:, None],
                  other=0.0).to(grad_ptr.dtype.element_ty)
    for r0 in range(0, R, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        idx = tl.load(rows_ptr + n.to(tl.int64)[:, None] * R + r[None, :],
                      mask=nmask[:, None], other=0)
        # A [BLOCK_Q, BLOCK_R, 1] mask like the backward's corner masks (and
        # one that Triton's interpreter honours: it drops atomics under a
        # [1, 1, 1] one); negative rows are out of bounds anyway.
        tl.atomic_add(grad_ptr + idx.to(tl.int64)[:, :, None] * D + d[None, None, :],
                      tl.broadcast_to(src[:, None, :], [BLOCK_Q, BLOCK_R, D]),
                      mask=nmask[:, None, None] & (idx >= 0)[:, :, None], sem="relaxed")


def scatter_add(grad: torch.Tensor, rows: torch.Tensor, src: torch.Tensor, block_q: int = 1,
                block_r: int = 16, num_warps: int = 1) -> torch.Tensor:
    """Adds src (N, D) into the rows ``rows`` (N, R) of ``grad`` viewed as
    (rows, D), in place; returns grad.  D and block_r must be powers of two
    and R a multiple of block_r."""
    D = grad.shape[-1]
    N, R = rows.shape
    check_row_tile(D, R, block_r)
    if src.shape != (N, D):
        raise ValueError(f"src {tuple(src.shape)} must be (N, D) = ({N}, {D}) for rows "
                         f"{tuple(rows.shape)} and grad rows of D={D}")
    if not (grad.is_contiguous() and rows.is_contiguous() and src.is_contiguous()):
        raise ValueError("grad, rows and src must be contiguous")
    scatter_add_kernel[(triton.cdiv(N, block_q),)](grad, rows, src, N, R=R, D=D,
                                                   BLOCK_Q=block_q, BLOCK_R=block_r,
                                                   num_warps=num_warps)
    return grad
