"""The deterministic backward's grad_value in PyTorch ops: the same fixed
point (int64, or for 16-bit values the rows' integer-valued fp32 sums), the
same fp operations in the same order, so that on the CPU (the interpreter,
whose numpy fp32 ops round as PyTorch's) it is bitwise the kernels' result."""
from __future__ import annotations

import torch

from msda_mm.ops import launch


def _exponent(x: torch.Tensor) -> torch.Tensor:
    """ex with x < 2**ex for x >= 0, from the exponent field (fp32 or fp64)."""
    if x.dtype == torch.float64:
        return ((x.view(torch.int64) >> 52) & 2047) - 1022
    return (((x.view(torch.int32) >> 23) & 255) - 126).long()


def fixed_point_exponent(bound: torch.Tensor, acc: torch.dtype):
    """(e, ok) per head as fixed_point._fixed_point_exponent: the largest e with
    bound * 2**e < 2**61, capped at 2 * (bias - 1); ok False past 2**bias."""
    bias = 1023 if acc == torch.float64 else 127
    ex = _exponent(bound)
    ok = ex <= bias
    return torch.where(ok, torch.clamp(61 - ex, max=2 * bias - 2), 0), ok


def _pow2(e: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    return torch.pow(2.0, e.double()).to(acc)  # exact: e is in acc's normal range


def _corners(spatial_shapes, loc, attn, acc, S):
    """Per level and bilinear corner: the corner weights c (B, Q, M, K) in
    acc and their value rows (row S where the corner is outside its level)."""
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
            yield c, torch.where(inside, start + yy * W + xx, S)
        start += H * W


def _scatter(shape, rows, terms):
    """Sums (int64) of terms (B, Q, M, K, ...) into rows (B, Q, M, K) of a
    (B, S + 1, M, ...) zero tensor."""
    B, _, M = shape[:3]
    sums = torch.zeros(shape, dtype=torch.int64)
    b_idx = torch.arange(B)[:, None, None, None]
    m_idx = torch.arange(M)[None, None, :, None]
    sums.index_put_((b_idx, rows, m_idx), terms, accumulate=True)
    return sums


def fixed_point_grad_value(value, spatial_shapes, loc, attn, grad_out) -> torch.Tensor:
    """grad_value (B, S, M, D) in value's dtype, as the kernels make it:
    exact_sums_grad_value for 16-bit values with fp32 arithmetic; otherwise
    every live sample's four corner terms c * go * 2**e truncated to int64,
    summed exactly, times 2**-e and rounded once; NaN in heads without a
    fixed point."""
    B, S, M, D = value.shape
    acc = torch.float64 if torch.float64 in (value.dtype, loc.dtype, attn.dtype) else torch.float32
    if value.element_size() == 2 and acc == torch.float32:
        return exact_sums_grad_value(value, spatial_shapes, loc, attn, grad_out)
    go = grad_out.unflatten(-1, (M, D))
    e, ok = fixed_point_exponent(launch.grad_value_bound(go, attn), acc)
    half = e >> 1
    # 2**e as two factors, per (b, m), broadcast over (Q, K, D).
    up = [_pow2(p, acc)[:, None, :, None, None] for p in (half, e - half)]
    sums = 0
    for c, row in _corners(spatial_shapes, loc, attn, acc, S):
        terms = (c[..., None] * go[:, :, :, None, :].to(acc) * up[0] * up[1]).to(torch.int64)
        sums = sums + _scatter((B, S + 1, M, D), row, terms)
    down = [_pow2(p, acc)[:, None, :, None] for p in (-half, half - e)]
    out = sums[:, :S].to(acc) * down[0] * down[1]
    return torch.where(ok[:, None, :, None], out, float("nan")).to(value.dtype)


def _times_pow2(v: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """exact_sums._times_pow2: v * 2**k, k clamped to [-252, 254], two factors."""
    k = k.clamp(-252, 254)
    half = k >> 1
    return v * _pow2(half, torch.float32) * _pow2(k - half, torch.float32)


def _scaled_weight(c, kq, shift):
    return _times_pow2(c, shift + kq).clamp(-2.0**64, 2.0**64)


def exact_sums_grad_value(value, spatial_shapes, loc, attn, grad_out) -> torch.Tensor:
    """grad_value of 16-bit values (exact_sums.py): per row the units
    u = ceil(|c| * g_q * 2**(20-p) * (1 + 2**-22)) summed in int64 give its
    exponent e; the terms fma(c * 2**(e+k), go * 2**-k, MAGIC) - MAGIC (as the
    interpreter computes an fma: a product and a sum, each rounded) summed
    exactly, times 2**-e, rounded once to value's dtype."""
    B, S, M, D = value.shape
    Q = loc.shape[1]
    go = grad_out.unflatten(-1, (M, D))
    bound = launch.grad_value_bound(go, attn)
    ok = _exponent(bound) <= 127
    p = (_exponent(bound) - (Q.bit_length() - 1)).clamp(-300, 130)[:, None, :, None]
    go = go.float()
    g = go.abs().amax(-1)
    kq = _exponent(g).clamp(-126, 126)[..., None]  # (B, Q, M, 1): per query, over K
    gs = g[..., None] * _pow2(-kq, torch.float32)
    corners = list(_corners(spatial_shapes, loc, attn, torch.float32, S))
    units = 0
    for c, row in corners:
        u = torch.ceil(_scaled_weight(c.abs(), kq, 20 - p) * gs * (1.0 + 2.0**-22))
        units = units + _scatter((B, S + 1, M), row, u.long())
    n = _exponent(units.clamp(min=1).float())
    e = (42 - n - p[:, :, :, 0]).clamp(max=252)  # (B, S + 1, M)
    magic = 1.5 * 2**23
    gos = go * _pow2(-kq, torch.float32)  # (B, Q, M, D)
    sums = 0
    for c, row in corners:
        e_row = e[torch.arange(B)[:, None, None, None], row, torch.arange(M)[None, None, :, None]]
        cs = _scaled_weight(c, kq, e_row)
        t = cs[..., None] * gos[:, :, :, None, :] + magic - magic
        sums = sums + _scatter((B, S + 1, M, D), row, t.long())
    out = _times_pow2(sums[:, :S].float(), -e[:, :S, :, None])
    return torch.where(ok[:, None, :, None], out, float("nan")).to(value.dtype)
