"""The launchers' tile policy: the tuned tiles, the rules that adapt them to a
call's shapes and dtypes, which kernel the forward takes and which sort the
deterministic backward takes; and ``tile_override``, a tuning hook for the
benchmark and the tests (not an API for models).

A ``Tiles`` value is immutable: ``TUNED`` is the shipped policy, and
``Tiles(fwd=..., sort=...)`` one with some tiles or the sort fixed.  The
launchers take one as an argument; the op resolves ``current_tiles()`` (what
``tile_override`` set, else ``TUNED``) on the calling thread in the forward
and carries it to the backward, which autograd may run on another thread.
"""
from __future__ import annotations

import contextlib
import dataclasses
from contextvars import ContextVar

import torch
import triton.language as tl

from .runtime import channel_pairs, next_pow2

# (BLOCK_Q, num_warps, BLOCK_P) per kernel and value element size at D = 32 and
# L * K = 16 (wider heads: Tiles.tile), each the fastest of the tiles swept on the
# H200 (docs/design.md).
_TILES = {("fwd", 4): (2, 1, 16), ("fwd", 2): (2, 1, 16),
          ("bwd", 4): (1, 1, 8), ("bwd", 2): (1, 1, 16),
          # msda_bwd_kernel without grad_value (the deterministic backward): more queries a
          # program than the float backward; below _FEW_ROWS rows ("bwd_few", the decoders)
          # 1 query.
          ("bwd_det", 4): (4, 1, 8), ("bwd_det", 2): (4, 1, 16),
          ("bwd_few", 4): (1, 1, 16), ("bwd_few", 2): (1, 1, 16),
          # grad_value_gather_kernel's (BLOCK_S rows, num_warps, BLOCK_E entries a step) for
          # dense rows, those of the stable sort's float pass (sparse rows: _GATHER_SPARSE).
          ("gather", 4): (4, 1, 16), ("gather", 2): (4, 1, 16)}
# Below this many entries a value row (4 * Q * L*K / S) the deterministic backward's gather
# takes many rows a program: one-entry rows make the grid the cost (docs/design.md).
_GATHER_SPARSE = (8, (32, 1, 1))
# Below this many entries a value row the deterministic backward takes the counting sort,
# where the stable sort's radix sort costs more than the pass it saves (docs/design.md).
_STABLE_SORT_ENTRIES = 2
# Below this many (batch, query, head) rows a 16-bit (and fp64) forward takes 1 query a
# program (fp32 keeps 2; docs/design.md), and the deterministic backward's msda_bwd_kernel
# its "bwd_few" tile.
_FEW_ROWS = 1 << 16
# msda_fwd_pairs_kernel's queries per one-warp program at D = 32, by value's element
# size (wider heads: Tiles.pairs_tile; docs/design.md).
_PAIRS_QUERIES_D32 = {2: 8, 4: 4}
# The deterministic backward's sorts (Tiles.deterministic_sort).
SORTS = ("stable", "counting")


def _sparse_rows(value: torch.Tensor, samples: int, entries: int = _GATHER_SPARSE[0]) -> bool:
    """Whether value's rows get fewer than ``entries`` bilinear entries each
    on average from ``samples`` = Q * L * K samples a head."""
    return 4 * samples < entries * value.shape[1]


@dataclasses.dataclass(frozen=True)
class Tiles:
    """The tile policy, the tuned one where a field is None: ``fwd``
    (BLOCK_Q, num_warps[, BLOCK_P]) sends every forward to msda_fwd_kernel
    with that tile; ``bwd`` is msda_bwd_kernel's (either backward);
    ``pairs`` (BLOCK_Q, num_warps) sends every forward that
    msda_fwd_pairs_kernel can take to it; ``gather`` (BLOCK_S, num_warps,
    BLOCK_E) is the deterministic backward's grad_value_gather_kernel;
    ``sort`` ("stable" or "counting") its sort, whatever the rows' density."""
    fwd: tuple[int, ...] | None = None
    bwd: tuple[int, ...] | None = None
    pairs: tuple[int, int] | None = None
    gather: tuple[int, int, int] | None = None
    sort: str | None = None

    def __post_init__(self):
        if self.sort not in (None, *SORTS):
            raise ValueError(f"Tiles: sort must be one of {SORTS}, got {self.sort!r}")

    def deterministic_sort(self, value: torch.Tensor, samples: int) -> str:
        """How the deterministic backward buckets ``samples`` = Q * L * K
        samples a head by cell for value (B, S, M, D): "stable"
        (deterministic/sorted_fill.py: a stable radix sort, then
        grad_value summed in float in sample order, one pass) for rows of
        _STABLE_SORT_ENTRIES entries or more, "counting" (atomic ranks, then
        integer sums at each row's exponent, two passes:
        deterministic/bucket_fill.py) for sparser ones, where the
        radix sort's fixed cost outweighs the pass it saves."""
        return self.sort or (
            "counting" if _sparse_rows(value, samples, _STABLE_SORT_ENTRIES) else "stable")

    def tile(self, kernel: str, value: torch.Tensor, points: int, rows: int,
             element_size: int = 0) -> dict:
        """Launch constants of ``kernel`` ("fwd", "bwd", "bwd_det": msda_bwd_kernel
        without grad_value, or "gather") for ``points`` = L * K sampling points
        per query and ``rows`` = B * Q * M (query, head) pairs; the tuned
        tile is that of value's element size, or of ``element_size`` where
        given.  The gather takes ``points`` = Q * L * K samples a head and
        ``rows`` = B * S * M."""
        if kernel == "bwd_det" and rows < _FEW_ROWS:
            kernel = "bwd_few"
        tile = _TILES[kernel, min(element_size or value.element_size(), 4)]
        kernel = "bwd" if kernel.startswith("bwd") else kernel
        override = getattr(self, kernel)
        block_q, num_warps, *block_p = override or tile
        if override is None:
            if kernel == "gather" and _sparse_rows(value, points):
                block_q, num_warps, *block_p = _GATHER_SPARSE[1]
            if kernel == "fwd" and rows < _FEW_ROWS and value.dtype != torch.float32:
                block_q = 1
        block_p = min(next_pow2(points), *block_p or [16])
        block_d = next_pow2(value.shape[-1])
        # A wider head first takes queries off the tile (the registers of the
        # tuned D = 32 tile), then, past 2x the tuned elements per warp (D >= 128),
        # adds warps: one warp spilled at D = 256 (research/compile_check.py).
        tuned = block_q * block_p * 32
        block_q = max(1, tuned // (block_p * block_d))
        if kernel == "gather":
            # Every thread keeps each row's four cells' run, largest exponent and entry count (a
            # warp's threads share the rows): past D = 32 the rows shrink with D once more.
            block_q = max(1, block_q * 32 // max(block_d, 32))
        num_warps = min(8, max(num_warps, num_warps * block_q * block_p * block_d // (2 * tuned)))
        return dict(BLOCK_Q=block_q, BLOCK_P=block_p, BLOCK_D=block_d, num_warps=num_warps)

    def pairs_tile(self, value: torch.Tensor, rows: int, acc) -> dict | None:
        """Launch constants for msda_fwd_pairs_kernel, or None where it does
        not apply: fp16/bf16/fp32 values whose rows are whole words of two
        channels (runtime.channel_pairs), fp32 accumulation, and a grid past
        _FEW_ROWS rows (or a ``pairs`` tile)."""
        if self.fwd is not None or (self.pairs is None and rows < _FEW_ROWS):
            return None
        if not channel_pairs(value) or acc is not tl.float32:
            return None
        block_d = next_pow2(value.shape[3])
        queries = _PAIRS_QUERIES_D32[value.element_size()]
        block_q, num_warps = self.pairs or (max(1, queries * 32 // block_d), 1)
        return dict(BLOCK_Q=block_q, BLOCK_D=block_d, num_warps=num_warps)


# The shipped policy.
TUNED = Tiles()
_CURRENT: ContextVar[Tiles] = ContextVar("msda_mm_tiles", default=TUNED)


def current_tiles() -> Tiles:
    """The policy that tile_override set in this context, else TUNED."""
    return _CURRENT.get()


@contextlib.contextmanager
def tile_override(fwd: tuple[int, ...] | None = None, bwd: tuple[int, ...] | None = None,
                  pairs: tuple[int, int] | None = None,
                  gather: tuple[int, int, int] | None = None, sort: str | None = None):
    """Run the op with these tiles (``Tiles``' fields; those not given stay
    as the enclosing block set them) inside this block, in this thread or
    task.  Yields the policy in force."""
    given = {name: tile for name, tile in
             (("fwd", fwd), ("bwd", bwd), ("pairs", pairs), ("gather", gather), ("sort", sort))
             if tile is not None}
    token = _CURRENT.set(dataclasses.replace(_CURRENT.get(), **given))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)
