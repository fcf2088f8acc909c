"""Deterministic MSDA inputs for a preset.

Drawn on the CPU from one seeded generator, so every device and run sees the
same numbers; value then goes to the benchmarked dtype while locations and
weights stay fp32, which is what mmdet hands the op under AMP.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from msda_mm.ops import level_start_index_from_shapes

from .presets import Preset

DISTRIBUTIONS = ("uniform", "clustered")

# Spread of a clustered sample around its reference point, in pixels of its
# level.  Deformable DETR initialises point k of a head k+1 px from the
# reference (1..4 px for K=4) and trained offsets stay of that order, so a
# query's samples fall in a few-pixel window: neighbouring queries read the
# same rows (L2 hits) and their backward atomics hit the same addresses.
CLUSTER_SIGMA_PX = 2.0


@dataclass
class MSDAInputs:
    """value (B, S, M, D); spatial_shapes (L, 2) int64 (H, W);
    level_start_index (L,) int64; sampling_locations (B, Q, M, L, K, 2)
    normalised (x, y); attention_weights (B, Q, M, L, K), softmax over L*K;
    grad_output (B, Q, M*D), the fixed upstream gradient of the backward."""
    value: torch.Tensor
    spatial_shapes: torch.Tensor
    level_start_index: torch.Tensor
    sampling_locations: torch.Tensor
    attention_weights: torch.Tensor
    grad_output: torch.Tensor

    def to(self, device, value_dtype: torch.dtype) -> "MSDAInputs":
        """On ``device``, value and grad_output in ``value_dtype`` (the op's
        output dtype); locations and weights keep their dtype (fp32)."""
        return MSDAInputs(self.value.to(device, value_dtype), self.spatial_shapes.to(device),
                          self.level_start_index.to(device),
                          self.sampling_locations.to(device), self.attention_weights.to(device),
                          self.grad_output.to(device, value_dtype))


def pixel_centres(levels) -> torch.Tensor:
    """(S, 2) normalised (x, y) centre of every value position, in value order
    (level by level, row-major)."""
    centres = []
    for h, w in levels:
        y, x = torch.meshgrid((torch.arange(h) + 0.5) / h, (torch.arange(w) + 0.5) / w,
                              indexing="ij")
        centres.append(torch.stack((x, y), -1).reshape(h * w, 2))
    return torch.cat(centres)


def _clustered_locations(preset: Preset, gen: torch.Generator) -> torch.Tensor:
    """Reference point per query (encoder: its own pixel centre; decoder: a
    uniform random point) plus N(0, CLUSTER_SIGMA_PX) pixel offsets per level."""
    B, Q, M, K = preset.batch, preset.num_queries, preset.heads, preset.points
    L = len(preset.levels)
    if preset.encoder:
        ref = pixel_centres(preset.levels).expand(B, Q, 2)
    else:
        ref = torch.rand(B, Q, 2, generator=gen)
    # (W_l, H_l) per level, broadcast against (B, Q, M, L, K, 2).
    level_wh = torch.tensor([(w, h) for h, w in preset.levels], dtype=torch.float32)
    offsets_px = CLUSTER_SIGMA_PX * torch.randn(B, Q, M, L, K, 2, generator=gen)
    return ref[:, :, None, None, None, :] + offsets_px / level_wh[:, None, :]


def make_inputs(preset: Preset, distribution: str, seed: int = 0) -> MSDAInputs:
    """fp32 CPU inputs of ``preset`` with locations drawn from
    ``distribution`` ('uniform': U[0, 1]; 'clustered': see
    _clustered_locations).  Same seed, same tensors."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown location distribution {distribution!r}, "
                         f"expected one of {DISTRIBUTIONS}")
    gen = torch.Generator().manual_seed(seed)
    B, S, Q = preset.batch, preset.num_values, preset.num_queries
    M, D, L, K = preset.heads, preset.head_dim, len(preset.levels), preset.points
    value = torch.randn(B, S, M, D, generator=gen)
    attention = torch.randn(B, Q, M, L * K, generator=gen).softmax(-1).view(B, Q, M, L, K)
    if distribution == "uniform":
        locations = torch.rand(B, Q, M, L, K, 2, generator=gen)
    else:
        locations = _clustered_locations(preset, gen)
    grad_output = torch.randn(B, Q, M * D, generator=gen)
    shapes = torch.tensor(preset.levels, dtype=torch.int64)
    return MSDAInputs(value, shapes, level_start_index_from_shapes(shapes), locations, attention,
                      grad_output)
