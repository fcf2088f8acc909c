"""The gather ceiling: how fast this GPU can fetch the rows an MSDA forward
fetches, with none of the op's other work.

The encoder forward is bound by moving gathered value rows from L2 to the
SMs (docs/design.md: 1.46 GB in ~172 us in bf16, 2.9 GB in ~231 us in
fp32), and its targets ask for 190 us in fp32.  Whether any kernel can is
a question for the hardware: ``gather_sum_kernel`` reads exactly the corner
rows of a preset's samples (indices computed beforehand, so no location
math, no weights, no masks) and sums them per (batch, query, head), in the
op's own tile shape.  Its time is a floor for the forward's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from bench.op.inputs import MSDAInputs


def corner_rows(inputs: MSDAInputs) -> torch.Tensor:
    """(B * Q * M, L * K * 4) int32: for every sample, the rows of value
    viewed as (B * S * M, D) that its four bilinear corners read, clamped
    into its level (the op skips corners outside it; here every corner is
    fetched, a slight over-count at the levels' edges)."""
    value, loc = inputs.value, inputs.sampling_locations
    B, S, M, _ = value.shape
    _, Q, _, L, K, _ = loc.shape
    shapes = inputs.spatial_shapes.to(loc.device)
    H = shapes[:, 0].view(1, 1, 1, L, 1)
    W = shapes[:, 1].view(1, 1, 1, L, 1)
    start = inputs.level_start_index.to(loc.device).view(1, 1, 1, L, 1)
    x0 = torch.floor(loc[..., 0] * W - 0.5).long()
    y0 = torch.floor(loc[..., 1] * H - 0.5).long()
    corners = []
    for dy in (0, 1):
        for dx in (0, 1):
            x = torch.minimum((x0 + dx).clamp_min(0), W - 1)
            y = torch.minimum((y0 + dy).clamp_min(0), H - 1)
            s = start + y * W + x  # (B, Q, M, L, K)
            b = torch.arange(B, device=loc.device).view(B, 1, 1, 1, 1)
            m = torch.arange(M, device=loc.device).view(1, 1, M, 1, 1)
            corners.append((b * S + s) * M + m)
    rows = torch.stack(corners, -1)  # (B, Q, M, L, K, 4)
    if rows.max() >= 2**31:
        raise ValueError(f"value {tuple(value.shape)} has too many rows for int32 indices")
    return rows.reshape(B * Q * M, L * K * 4).to(torch.int32)


def distinct_rows(rows: torch.Tensor, R: int, shuffle: bool, seed: int = 0) -> torch.Tensor:
    """(ceil(U / R), R) int32: each of the U distinct rows of ``rows`` once,
    in ascending or (``shuffle``) a seeded random order, the last line
    padded by repeating the rows from the first on (at most R - 1 repeats,
    L2 hits).

    Summed with gather_sum after an L2 flush, this reads from DRAM the
    value rows a forward must read at least once (corner_rows' slight
    over-count at the levels' edges included): the bytes are a floor for
    any forward with a cold L2, and the time, that of a kernel doing
    nothing else (random order: as a forward over random locations reads
    them).  On the H200, decoder preset: 17.0 MB of bf16 rows in 10.8 us of
    kernel shuffled, 9.1 sorted, against 12.3 for the forward in the same
    run (docs/design.md)."""
    uniq = rows.reshape(-1).unique()
    if shuffle:
        gen = torch.Generator(uniq.device).manual_seed(seed)
        uniq = uniq[torch.randperm(uniq.numel(), generator=gen, device=uniq.device)]
    pad = torch.arange(-uniq.numel() % R, device=uniq.device) % uniq.numel()
    return torch.cat([uniq, uniq[pad]]).view(-1, R).to(torch.int32)


def check_row_tile(D: int, R: int, block_r: int) -> None:
    """ValueError unless D and block_r are powers of two and block_r divides R."""
    if D & (D - 1) or R % block_r or block_r & (block_r - 1):
        raise ValueError(f"D={D} must be a power of two and R={R} a multiple of "
                         f"block_r={block_r} (a power of two)")


@triton.jit
def gather_sum_kernel(value_ptr, rows_ptr, out_ptr, N, R: tl.constexpr, D: tl.constexpr,
                      BLOCK_Q: tl.constexpr, BLOCK_R: tl.constexpr):
    """out[n, :] = sum_r value_rows[rows[n, r], :] for BLOCK_Q outputs n per
    program, BLOCK_R rows at a time; value rows (D contiguous elements),
    rows (N, R) int32, out (N, D) in value's dtype.  Grid: cdiv(N, BLOCK_Q)."""
    n = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    nmask = n < N
    d = tl.arange(0, D)
    acc = tl.zeros([BLOCK_Q, D], dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        idx = tl.load(rows_ptr + n.to(tl.int64)[:, None] * R + r[None, :],
                      mask=nmask[:, None], other=0)
        vals = tl.load(value_ptr + idx.to(tl.int64)[:, :, None] * D + d[None, None, :],
                       mask=nmask[:, None, None], other=0.0)
        acc += tl.sum(vals.to(tl.float32), axis=1)
    tl.store(out_ptr + n.to(tl.int64)[:, None] * D + d[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=nmask[:, None])


def gather_sum(value: torch.Tensor, rows: torch.Tensor, block_q: int = 2, block_r: int = 16,
               num_warps: int = 1) -> torch.Tensor:
    """Sum of the rows ``rows`` (N, R) of ``value`` viewed as (rows, D):
    (N, D) in value's dtype.  D and R must be powers of two, R a multiple
    of block_r."""
    D = value.shape[-1]
    N, R = rows.shape
    check_row_tile(D, R, block_r)
    if not value.is_contiguous() or not rows.is_contiguous():
        raise ValueError("value and rows must be contiguous")
    out = value.new_empty(N, D)
    gather_sum_kernel[(triton.cdiv(N, block_q),)](value, rows, out, N, R=R, D=D,
                                                  BLOCK_Q=block_q, BLOCK_R=block_r,
                                                  num_warps=num_warps)
    return out
