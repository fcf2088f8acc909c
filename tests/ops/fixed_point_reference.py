"""The deterministic backward's grad_value in PyTorch ops: the same fixed
point, the same fp operations in the same order, so that on the CPU (the
interpreter, whose numpy fp32 ops round as PyTorch's) it is bitwise the
kernels' result."""
from __future__ import annotations

import torch

from msda_mm.ops import launch


def fixed_point_exponent(bound: torch.Tensor, acc: torch.dtype):
    """(e, ok) per head as fixed_point._fixed_point_exponent: the largest e with
    bound * 2**e < 2**61, capped at 2 * (bias - 1); ok False past 2**bias."""
    bias = 1023 if acc == torch.float64 else 127
    ex = ((bound.view(torch.int64) >> 52) & 2047) - 1022
    ok = ex <= bias
    return torch.where(ok, torch.clamp(61 - ex, max=2 * bias - 2), 0), ok


def _pow2(e: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    return torch.pow(2.0, e.double()).to(acc)  # exact: e is in acc's normal range


def fixed_point_grad_value(value, spatial_shapes, loc, attn, grad_out) -> torch.Tensor:
    """grad_value (B, S, M, D) in value's dtype: every live sample's four
    corner terms c * go * 2**e truncated to int64, summed exactly, times
    2**-e and rounded once; NaN in heads without a fixed point."""
    B, S, M, D = value.shape
    _, Q, _, L, K, _ = loc.shape
    acc = torch.float64 if torch.float64 in (value.dtype, loc.dtype, attn.dtype) else torch.float32
    go = grad_out.unflatten(-1, (M, D))
    e, ok = fixed_point_exponent(launch.grad_value_bound(go, attn), acc)
    half = e >> 1
    # 2**e as two factors, per (b, m), broadcast over (Q, K, D).
    up = [_pow2(p, acc)[:, None, :, None, None] for p in (half, e - half)]
    sums = torch.zeros(B, S + 1, M, D, dtype=torch.int64)  # row S: corners outside the level
    b_idx = torch.arange(B)[:, None, None, None]
    m_idx = torch.arange(M)[None, None, :, None]
    start = 0
    for lvl, (H, W) in enumerate(spatial_shapes.tolist()):
        x_im = loc[:, :, :, lvl, :, 0].to(acc) * W - 0.5
        y_im = loc[:, :, :, lvl, :, 1].to(acc) * H - 0.5
        live = (x_im >= -1.0) & (x_im < W) & (y_im >= -1.0) & (y_im < H)
        x_im, y_im = torch.where(live, x_im, 0.0), torch.where(live, y_im, 0.0)
        x0, y0 = x_im.floor(), y_im.floor()
        lx, ly = x_im - x0, y_im - y0
        hx, hy = 1.0 - lx, 1.0 - ly
        w = attn[:, :, :, lvl].to(acc)
        corners = {(0, 0): w * hy * hx, (0, 1): w * hy * lx, (1, 0): w * ly * hx,
                   (1, 1): w * ly * lx}
        for (dy, dx), c in corners.items():
            yy, xx = y0.long() + dy, x0.long() + dx
            inside = live & (yy >= 0) & (yy < H) & (xx >= 0) & (xx < W)
            row = torch.where(inside, start + yy * W + xx, S)  # (B, Q, M, K)
            terms = (c[..., None] * go[:, :, :, None, :].to(acc) * up[0] * up[1]).to(torch.int64)
            sums.index_put_((b_idx, row, m_idx), terms, accumulate=True)
        start += H * W
    down = [_pow2(p, acc)[:, None, :, None] for p in (-half, half - e)]
    out = sums[:, :S].to(acc) * down[0] * down[1]
    return torch.where(ok[:, None, :, None], out, float("nan")).to(value.dtype)
