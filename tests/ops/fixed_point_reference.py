"""The deterministic backward's grad_value in PyTorch ops: the same per-row
fixed point (fixed_point.py, and exact_sums.py's terms for 16-bit values),
the same fp operations in the same order, so that on the CPU (the
interpreter, whose numpy fp32 ops round as PyTorch's) it is bitwise the
kernels' result."""
from __future__ import annotations

import torch

MAGIC = 1.5 * 2**23
C_MAX = 2.0**120
NO_ENTRY = -(2**14)


def _exponent(x: torch.Tensor) -> torch.Tensor:
    """ex with x < 2**ex for x >= 0, from the exponent field (fp32 or fp64)."""
    if x.dtype == torch.float64:
        return ((x.view(torch.int64) >> 52) & 2047) - 1022
    return (((x.view(torch.int32) >> 23) & 255) - 126).long()


def _pow2(e: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    return torch.pow(2.0, e.double()).to(acc)  # exact: e is in acc's normal range


def _limit(acc: torch.dtype) -> int:
    """The largest |k| of a normal 2**-k: 126 (fp32), 1022 (fp64)."""
    return 1022 if acc == torch.float64 else 126


def _times_pow2(v: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """fixed_point._times_pow2: v * 2**k, k clamped to [-2 limit, 2 limit + 2],
    as two factors."""
    k = k.clamp(-2 * _limit(v.dtype), 2 * _limit(v.dtype) + 2)
    half = k >> 1
    return v * _pow2(half, v.dtype) * _pow2(k - half, v.dtype)


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


def _row_max(shape, rows, values):
    """Per row of a (B, S + 1, M) NO_ENTRY tensor the largest of values
    (B, Q, M, K) that rows (B, Q, M, K) send there."""
    B, S1, M = shape
    flat = (torch.arange(B)[:, None, None, None] * S1 + rows) * M + torch.arange(M)[:, None]
    out = torch.full(shape, NO_ENTRY, dtype=torch.int64)
    out.view(-1).scatter_reduce_(0, flat.flatten(), values.flatten(), "amax")
    return out


def fixed_point_grad_value(value, spatial_shapes, loc, attn, grad_out) -> torch.Tensor:
    """grad_value (B, S, M, D) in value's dtype, as the kernels make it: per
    row X, the largest exponent of |c| * g_q (g_q * 2**-k_q first) plus k_q
    over its n < 2**N entries; for 16-bit values with fp32 arithmetic
    e = min(22, 31 - N) - X and the terms fma(c * 2**(e+k), go * 2**-k, MAGIC)
    - MAGIC (the interpreter's fma: a product and a sum, each rounded),
    otherwise e = 63 - N - X and the same product truncated; the integers
    summed exactly, times 2**-e, rounded once; g_q the max over the query's
    finite channels, and the terms with an inf or NaN factor summed apart
    in float, that sum the result where it is not 0 (nonfinite.py)."""
    B, S, M, D = value.shape
    acc = torch.float64 if torch.float64 in (value.dtype, loc.dtype, attn.dtype) else torch.float32
    fp32_terms = value.element_size() == 2 and acc == torch.float32
    go = grad_out.unflatten(-1, (M, D)).to(acc)
    g = torch.where(go.isfinite(), go.abs(), 0.0).amax(-1)
    kq = _exponent(g).clamp(-_limit(acc), _limit(acc))[..., None]  # (B, Q, M, 1): over K
    gs = g[..., None] * _pow2(-kq, acc)
    corners = list(_corners(spatial_shapes, loc, attn, acc, S))
    X = torch.full((B, S + 1, M), NO_ENTRY, dtype=torch.int64)
    n = 0
    for c, row in corners:
        ex = _exponent(c.abs() * gs)
        ex = ex + (ex > (1024 if acc == torch.float64 else 128)).long()  # an overflowed product
        X = torch.maximum(X, _row_max(X.shape, row, ex + kq))
        n = n + _scatter((B, S + 1, M), row, torch.ones_like(row))
    N = _exponent(n.clamp(min=1).float())
    e = ((31 - N).clamp(max=22) if fp32_terms else 63 - N) - X
    gos = go * _pow2(-kq, acc)  # (B, Q, M, D)
    sums, nonfinite = 0, torch.zeros(B, S + 1, M, D, dtype=acc)
    for c, row in corners:
        e_row = e[torch.arange(B)[:, None, None, None], row, torch.arange(M)[None, None, :, None]]
        cs = _times_pow2(c, e_row + kq).clamp(-C_MAX, C_MAX)
        t = cs[..., None] * gos[:, :, :, None, :]
        if fp32_terms:
            t = t + MAGIC - MAGIC
        sums = sums + _scatter((B, S + 1, M, D), row, t.long())
        term = c[..., None] * go[:, :, :, None, :]
        bad = ~(c.isfinite()[..., None] & go.isfinite()[:, :, :, None, :])
        nonfinite.index_put_((torch.arange(B)[:, None, None, None], row,
                              torch.arange(M)[None, None, :, None]),
                             torch.where(bad, term, 0.0), accumulate=True)
    out = _times_pow2(sums[:, :S].to(acc), -e[:, :S, :, None])
    return torch.where(nonfinite[:, :S] != 0, nonfinite[:, :S], out).to(value.dtype)
