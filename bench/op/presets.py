"""Problem sizes benchmarked: the MSDA calls of real detectors.

Hidden size 256 = 8 heads x 32 channels and 4 points per level, as in
Deformable DETR, DINO and Mask2Former.  Feature maps come from the input image
at the backbone's strides with ceil division (a stride-2 conv of an odd size
rounds up), so an 800x1333 COCO image gives (100, 167), (50, 84), (25, 42),
(13, 21): S = 22223 value positions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional


def pyramid(height: int, width: int, strides: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(H_l, W_l) of each level of an image of height x width pixels."""
    return tuple((math.ceil(height / s), math.ceil(width / s)) for s in strides)


@dataclass(frozen=True)
class Preset:
    """One MSDA call: value (B, S, M, D), locations (B, Q, M, L, K, 2).

    queries None marks an encoder (self-attention over the pyramid): one query
    per value position, Q = S, each sampling around its own pixel.
    """
    name: str
    batch: int
    levels: tuple[tuple[int, int], ...]
    queries: Optional[int] = None
    heads: int = 8
    head_dim: int = 32
    points: int = 4

    @property
    def encoder(self) -> bool:
        return self.queries is None

    @property
    def num_values(self) -> int:
        return sum(h * w for h, w in self.levels)

    @property
    def num_queries(self) -> int:
        return self.num_values if self.queries is None else self.queries

    def samples(self) -> int:
        """Bilinear samples of one forward: B * Q * M * L * K."""
        return self.batch * self.num_queries * self.heads * len(self.levels) * self.points

    def gathered_bytes(self, elem_size: int) -> int:
        """Value bytes the forward gathers: 4 corner rows of D per sample."""
        return self.samples() * 4 * self.head_dim * elem_size


_COCO = pyramid(800, 1333, (8, 16, 32, 64))

PRESETS = {p.name: p for p in (
    # CPU smoke tests (the Triton interpreter runs every program in Python):
    # two levels (3, 2) and (2, 1), S = Q = 8.
    Preset("tiny", 1, pyramid(24, 16, (8, 16)), heads=2, head_dim=8, points=2),
    Preset("decoder", 4, _COCO, queries=300),          # Deformable DETR decoder
    Preset("dino_decoder", 4, _COCO, queries=900),     # DINO: 900 queries
    Preset("encoder", 2, _COCO),
    Preset("encoder_hires", 1, pyramid(1536, 2048, (8, 16, 32, 64))),
    Preset("mask2former", 2, pyramid(1024, 1024, (8, 16, 32))),  # pixel decoder, 3 levels
)}

# The matrix a plain run covers: every real-model preset.
DEFAULT_PRESETS = tuple(name for name in PRESETS if name != "tiny")
