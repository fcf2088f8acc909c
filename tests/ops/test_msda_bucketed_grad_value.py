"""The deterministic backward's bucketed gather in the interpreter: the
counting sort against a PyTorch histogram, the stable sort against a PyTorch
stable sort, grad_value close to fp64 with each sort (the ``sort`` fixture)
where buckets are as full as they get and where samples sit on the level
borders, and with the counting sort bitwise the PyTorch fixed-point
reference (fixed_point_reference.py) whatever the gather kernel's tile."""
import numpy as np
import pytest
import torch

from msda_mm.ops.backward import launcher
from msda_mm.ops.backward.launcher import launch_backward
from msda_mm.ops.deterministic import buckets
from msda_mm.ops.deterministic.buffers import key_dtype
from msda_mm.ops.tiles import Tiles, tile_override

from fixed_point_reference import fixed_point_grad_value
from msda_inputs import FLOAT_INPUTS, FLOOR, make_inputs, reference_fn, rel_err, run_op

SHAPES = ((4, 5), (2, 3))
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _inputs(dtype, seed=0, lo=-0.5, hi=1.5, Q=6, shapes=SHAPES):
    return make_inputs(B=2, Q=Q, M=2, D=4, shapes=shapes, K=2, dtype=dtype, lo=lo, hi=hi,
                       seed=seed)[0]


def _grad_value(args, g, **kw):
    return run_op(args, grad_out=g, deterministic=True, **kw)[1]["value"]


def _check(args, sort, seed=0):
    """grad_value close to fp64 and, with the counting sort, bitwise the
    fixed-point reference."""
    B, Q, M = args["attention_weights"].shape[:3]
    g = torch.randn(B, Q, M * args["value"].shape[3], dtype=torch.float64,
                    generator=torch.Generator().manual_seed(seed)).to(args["value"].dtype)
    got = _grad_value(args, g)
    if sort == "counting":
        want = fixed_point_grad_value(args["value"], args["spatial_shapes"],
                                      args["sampling_locations"], args["attention_weights"], g)
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    f64 = {k: (v.double() if k in FLOAT_INPUTS else v) for k, v in args.items()}
    truth = run_op(f64, fn=reference_fn, grad_out=g.double())[1]["value"]
    # The existing accuracy floor (msda_inputs.FLOOR): each term loses at most
    # 2**(N-61) of its row's largest |c| * g_q (n < 2**N entries; 16-bit values
    # 2**-22), or an fp32 (fp64) add's rounding, besides the fp32 set-up's and
    # the store's roundings.
    assert rel_err(got, truth) <= FLOOR[args["value"].dtype]
    return got


def _with_locations(args, x, y):
    loc = args["sampling_locations"].clone()
    loc[..., 0], loc[..., 1] = x, y
    return dict(args, sampling_locations=loc)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_locations_match_the_references(dtype, sort):
    got = _check(_inputs(dtype, seed=1), sort, seed=1)
    assert got.count_nonzero() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_sample_in_one_cell(dtype, sort):
    # All locations equal: per (b, m, level) one bucket holds the head's 12
    # samples of that level (Q 6 x K 2; three steps of BLOCK_E = 4 under the
    # override), and its four corner rows take them all.
    args = _with_locations(_inputs(dtype, seed=2), 0.43, 0.61)
    _check(args, sort, seed=2)
    with tile_override(gather=(1, 1, 4)):
        _check(args, sort, seed=2)


def _borders(dtype):
    """Per level, x_im and y_im at -1 exactly, just inside W (H), at W
    exactly, just under -1 and inside: a (5, 5) grid of samples, Q = 25
    queries of one point per level."""
    args = make_inputs(B=1, Q=25, M=2, D=4, shapes=SHAPES, K=1, dtype=dtype, seed=3)[0]
    loc = args["sampling_locations"]
    for lvl, (H, W) in enumerate(SHAPES):
        for c, n in ((0, W), (1, H)):
            im = torch.tensor([-1.0, n - 2.0**-8, float(n), -1.0 - 2.0**-8, 0.3],
                              dtype=torch.float64)
            norm = ((im + 0.5) / n).to(loc.dtype)
            grid = norm[:, None].expand(5, 5) if c == 1 else norm[None, :].expand(5, 5)
            loc[0, :, :, lvl, 0, c] = grid.reshape(25, 1)
    return args


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_samples_on_the_borders(dtype, sort):
    # x_im = -1 touches column 0 with weight lx = 0; just under W touches
    # column W-1; W and below -1 are outside (no bucket, no term).
    got = _check(_borders(dtype), sort, seed=3)
    assert got.count_nonzero() > 0


def _lexsort(keys, fields):
    """The order that sorts by key, then by the fields (rows of ``fields``)."""
    return torch.from_numpy(np.lexsort([*fields.double().numpy()[::-1], keys.numpy()]))


def _sorted_samples(monkeypatch, args, sort="counting"):
    """The deterministic backward's ``sort`` of args' samples: cells a head
    and counting_records' (offsets, records) for the counting sort (from
    msda_bwd_kernel's ranks), stable_records' (bounds, records) for the
    stable sort (from its keys), kept as the backward makes them.  The
    gather, which only reads them, is left out (zeros for grad_value)."""
    name = {"counting": "counting_records", "stable": "stable_records"}[sort]
    bucketed, kept = getattr(buckets, name), []

    def keep(*a):
        cells = next(x.cells for x in a if hasattr(x, "cells"))  # CountingBuffers, KeyBuffers
        kept.append((cells, *bucketed(*a)))
        return kept[-1][1:]

    monkeypatch.setattr(buckets, name, keep)
    monkeypatch.setattr(launcher, "gather_grad_value",
                        lambda go, value, *rest: torch.zeros_like(value))
    with tile_override(sort=sort):
        run_op(args, deterministic=True)
    assert len(kept) == 1
    return kept[0]


def _samples(args, cells):
    """Each live sample's (bucket, query) as one key, its w, lx, ly, and its
    slot in the (B, M, Q, L, K) samples, from PyTorch; in slot order."""
    loc, attn = args["sampling_locations"], args["attention_weights"]
    B, Q, M, L, K, _ = loc.shape
    x_im = loc[..., 0] * args["spatial_shapes"][:, 1, None] - 0.5  # (B, Q, M, L, K)
    y_im = loc[..., 1] * args["spatial_shapes"][:, 0, None] - 0.5
    H, W = args["spatial_shapes"][:, 0, None], args["spatial_shapes"][:, 1, None]
    start = torch.cat([torch.zeros(1, dtype=torch.int64), ((H + 1) * (W + 1)).cumsum(0)[:-1, 0]])
    live = (x_im >= -1) & (x_im < W) & (y_im >= -1) & (y_im < H)
    cell = start[:, None] + (y_im.floor().long() + 1) * (W + 1) + x_im.floor().long() + 1
    head = torch.arange(B)[:, None, None, None, None] * M + torch.arange(M)[:, None, None]
    query = torch.arange(Q)[:, None, None, None].expand_as(cell)
    slot = torch.arange(B * M * Q * L * K).view(B, M, Q, L, K).permute(0, 2, 1, 3, 4)
    weights = torch.stack([attn, x_im - x_im.floor(), y_im - y_im.floor()])
    order = slot[live].argsort()
    return (((head * cells + cell) * Q + query)[live][order], weights[:, live][:, order],
            slot[live][order])


def test_bucket_counts_are_the_histogram_of_the_cells(monkeypatch):
    args = _inputs(torch.float32, seed=4, Q=9)
    B, S, M, _ = args["value"].shape
    _, Q, _, L, K, _ = args["sampling_locations"].shape
    args["sampling_locations"][0, 0, 0, 0, 0] = float("nan")  # never live: in no bucket
    cells, offsets, records = _sorted_samples(monkeypatch, args)
    assert records.dtype == torch.int32 and records.shape == (B * Q * M * L * K, 4)
    queries, fields = records[:, 0], records[:, 1:].view(torch.float32).T  # w, lx, ly
    keys, weights, _ = _samples(args, cells)
    hist = torch.bincount(keys // Q, minlength=B * M * cells)
    assert offsets[0] == 0 and torch.equal(offsets.diff().long(), hist)
    # Each bucket holds its own samples' records, in some order: sorted by
    # (bucket, query, w, lx, ly), both sides match.
    bucket = torch.repeat_interleave(torch.arange(B * M * cells), hist)
    got_keys = bucket * Q + queries[:len(keys)].long()
    want, got = _lexsort(keys, weights), _lexsort(got_keys, fields[:, :len(keys)])
    assert torch.equal(got_keys[got], keys[want])
    torch.testing.assert_close(fields[:, got], weights[:, want], rtol=0, atol=0)


@pytest.mark.parametrize("shapes, want_dtype", [(SHAPES, torch.int16),
                                                (((128, 256), (2, 3)), torch.int32)])
def test_stable_sort_holds_each_cells_samples_in_sample_order(monkeypatch, shapes, want_dtype):
    # As a PyTorch stable sort of the live samples by (cell, head) gives them:
    # the same records in the same order, each bucket's entries between its
    # bounds (empty ones (0, 0)); with 16-bit keys and, past 2**16 - 1 cells a
    # head (2 S + 2 L), 32-bit.
    args = _inputs(torch.float32, seed=4, Q=9, shapes=shapes)
    args["sampling_locations"][1, 2, 1, 1, 0] = float("nan")  # never live: in no bucket
    cells, bounds, records = _sorted_samples(monkeypatch, args, "stable")
    assert key_dtype(cells)[0] == want_dtype
    keys, weights, _ = _samples(args, cells)
    B, Q, M = args["attention_weights"].shape[:3]
    bucket = keys // Q
    pairs, order = (bucket % cells * B * M + bucket // cells).sort(stable=True)
    assert torch.equal(records[:len(keys), 0].long(), (keys % Q)[order])
    torch.testing.assert_close(records[:len(keys), 1:].view(torch.float32).T,
                               weights[:, order], rtol=0, atol=0)
    everyone = torch.arange(bounds.shape[1])
    full = torch.isin(everyone, pairs)
    want = torch.stack([torch.searchsorted(pairs, everyone),
                        torch.searchsorted(pairs, everyone, right=True)]) * full
    assert full.sum() > 1 and torch.equal(bounds.long(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_counting_sort_gather_tiles_leave_grad_value_bitwise_unchanged(dtype):
    # Other rows a program, entries a step and sum trees (16-bit: int32
    # sums a step, int64 across steps).
    args = _inputs(dtype, seed=5, lo=0.3, hi=0.7)
    g = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(5)).to(dtype)
    with tile_override(sort="counting"):
        first = _grad_value(args, g)
        for tile in [(1, 1, 1), (1, 1, 2), (2, 1, 4), (4, 2, 2), (8, 1, 16), (32, 4, 8)]:
            with tile_override(gather=tile):
                torch.testing.assert_close(_grad_value(args, g), first, rtol=0, atol=0)


@pytest.mark.parametrize("shapes", [((4, 5), (3, 3)),  # the last level runs 3 rows past S
                                    ((4, 5), (40000, 60000))])  # cells far past the bound
def test_shapes_that_disagree_with_value_stay_in_bounds(shapes, sort):
    # As test_msda_edge_cases' test for the float path: the launcher called
    # directly (the op would raise on CPU shapes), value covering level 0 and 6
    # positions of level 1.  Rows past the shapes' cells and cells past the
    # bound 2 S + 2 L take no samples; the rows of value get finite sums.
    args = make_inputs(B=1, Q=6, M=2, D=8, shapes=SHAPES, K=2, lo=0.0, hi=1.0, seed=6)[0]
    shapes_t = torch.tensor(shapes)
    value, loc, attn = args["value"], args["sampling_locations"], args["attention_weights"]
    grad_out = torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(6))
    det = launch_backward(grad_out, value, shapes_t, loc, attn, False, True,
                          tiles=Tiles(sort=sort))[0]
    assert det.shape == value.shape and torch.isfinite(det).all()
    if shapes[1][0] < 100:  # no wrapped index: the float backward's sums, rows past S dropped
        default = launch_backward(grad_out, value, shapes_t, loc, attn, True)[0]
        torch.testing.assert_close(det, default)



@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_row_of_520_equal_largest_terms_sums_exactly(dtype):
    # The int32 sums' worst case: 260 queries x 2 points at pixel (1, 2)'s
    # centre (corner weight 1, the other corners 0) and grad_output 1 - 2**-8
    # throughout, so that all 520 terms of the row are its largest, of one sign.
    args = make_inputs(B=1, Q=260, M=1, D=4, shapes=((4, 5),), K=2, dtype=dtype, seed=8)[0]
    args["sampling_locations"][..., 0], args["sampling_locations"][..., 1] = 0.5, 0.375
    args["attention_weights"].fill_(1.0)
    g = torch.full((1, 260, 4), 1 - 2.0**-8, dtype=dtype)
    with tile_override(sort="counting"):  # rows this dense take the stable sort
        got = _grad_value(args, g)
    want = torch.zeros_like(got)
    want[0, 1 * 5 + 2] = 520 * (1 - 2.0**-8)  # rounded to dtype as the kernel's one rounding
    torch.testing.assert_close(got, want, rtol=0, atol=0)
