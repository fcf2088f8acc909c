"""Forward and all three gradients against the fp64 reference.

CPU: the Triton kernels in the interpreter.  GPU (-m gpu): compiled kernels.
"""
import pytest
import torch

from msda_mm import multi_scale_deformable_attention

from msda_inputs import DEVICES, assert_close_to_reference, make_inputs

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D", [4, 24, 32, 64, 71])
def test_head_dims_and_dtypes(device, dtype, D):
    args, seed = make_inputs(D=D, dtype=dtype)
    assert_close_to_reference(args, device, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("L", [1, 4, 5])
@pytest.mark.parametrize("K", [1, 4, 8])
def test_levels_and_points(device, L, K):
    shapes = [(7, 5), (4, 3), (2, 2), (1, 3), (1, 1)][:L]
    args, seed = make_inputs(B=1, Q=8, M=2, D=8, shapes=shapes, K=K)
    assert_close_to_reference(args, device, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value_dtype,other_dtype", [
    (torch.bfloat16, torch.float32),   # what mmdet hands over under bf16 AMP
    (torch.float16, torch.float32),
    (torch.float32, torch.bfloat16),
], ids=str)
def test_mixed_dtypes(device, value_dtype, other_dtype):
    args, seed = make_inputs(dtype=value_dtype, loc_dtype=other_dtype, attn_dtype=other_dtype)
    assert_close_to_reference(args, device, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_locations_stay_fp32_with_bf16_value(device):
    """bf16 locations are off by up to ~0.4 px at W=200: the op must sample
    at the fp32 location it was given.  Value is the column index (exact in
    bf16), so each sample is its pixel x coordinate, and the fp32 gradient
    of its weight (grad_out = 1) is D times that coordinate."""
    from msda_mm import multi_scale_deformable_attention as msda
    W, D, Q = 200, 4, 64
    value = torch.arange(W, dtype=torch.float32).repeat(3)  # 3 rows of 0..199
    value = value.view(1, 3 * W, 1, 1).expand(1, 3 * W, 1, D).to(torch.bfloat16)
    loc = (0.3 + 0.4 * torch.rand(1, Q, 1, 1, 1, 2)).requires_grad_()
    attn = torch.ones(1, Q, 1, 1, 1, requires_grad=True)
    out = msda(value.to(device), torch.tensor([[3, W]], device=device), None,
               loc.to(device), attn.to(device))
    (grad_attn,) = torch.autograd.grad(out.float().sum(), attn)
    x_pixel = loc[..., 0].detach() * W - 0.5
    torch.testing.assert_close(grad_attn / D, x_pixel, rtol=0, atol=1e-3)
    rounded = loc[..., 0].detach().to(torch.bfloat16).float() * W - 0.5
    assert (rounded - x_pixel).abs().max() > 0.05  # the test can tell them apart


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("Q", [1, 17, 33])
# The default tiles (these fp32 inputs: the 2-query forward, 8 queries at
# D = 8), then the 1-query forward of small 16-bit grids (4 queries at D = 8)
# and a backward of 2 queries x 8-point chunks.
@pytest.mark.parametrize("tiles", [{}, dict(fwd=(1, 1, 16), bwd=(2, 1, 8))], ids=["auto", "other"])
def test_query_count_not_multiple_of_tile(device, Q, tiles):
    from msda_mm.ops.tiles import tile_override
    args, seed = make_inputs(Q=Q)
    with tile_override(**tiles):
        assert_close_to_reference(args, device, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("where", ["centres", "edges"])
def test_exact_grid_points(device, where):
    """Locations on pixel centres ((i + 0.5) / W: integer pixel coordinates,
    one corner weight exactly 1) and on pixel edges (i / W, including the
    image border 0 and 1)."""
    args, seed = make_inputs(B=1, Q=6, M=2, shapes=((4, 5), (2, 3)), K=2)
    g = torch.Generator().manual_seed(seed)
    loc = args["sampling_locations"]
    for lvl, (h, w) in enumerate([(4, 5), (2, 3)]):
        shift = 0.5 if where == "centres" else 0.0
        for axis, size in ((0, w), (1, h)):
            ints = torch.randint(0, size + 1, loc[..., lvl, :, axis].shape, generator=g)
            loc[..., lvl, :, axis] = (ints + shift) / size
    assert_close_to_reference(args, device, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_inputs(device):
    args, seed = make_inputs(B=2, Q=6, M=2, D=8)
    # Same values, other memory layouts: transposed storage and strided slices.
    args["value"] = args["value"].transpose(0, 1).contiguous().transpose(0, 1)
    loc = args["sampling_locations"]
    args["sampling_locations"] = torch.cat([loc, loc], dim=-1)[..., ::2]
    args["attention_weights"] = args["attention_weights"].permute(4, 3, 2, 1, 0).contiguous() \
        .permute(4, 3, 2, 1, 0)
    assert not args["value"].is_contiguous() and not args["sampling_locations"].is_contiguous()
    assert_close_to_reference(args, device, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_a_strided_grad_output_gives_the_contiguous_ones_gradients(device):
    """The backward reads grad_output (B, Q, M * D) by its strides as
    (B, Q, M, D): transposed and every-other-column layouts give the
    contiguous one's gradients, bitwise for the locations and weights (no
    atomics); grad_value's float atomics add in a varying order, so on CUDA
    it may differ by fp32 reordering (2**-23 relative per addition)."""
    args, _ = make_inputs(B=2, Q=6, M=2, D=8)
    args = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    leaves = [args[k].requires_grad_() for k in ("value", "sampling_locations",
                                                   "attention_weights")]
    out = multi_scale_deformable_attention(**args)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(device)
    layouts = [go.transpose(0, 1).contiguous().transpose(0, 1),
               torch.stack([go, go], dim=-1)[..., 0]]
    want = torch.autograd.grad(out, leaves, go, retain_graph=True)
    for strided in layouts:
        assert not strided.is_contiguous()
        got = torch.autograd.grad(out, leaves, strided, retain_graph=True)
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
        for g, w in zip(got[1:], want[1:]):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_level_start_index_given_or_derived(device):
    args, seed = make_inputs()
    args["level_start_index"] = torch.tensor([0, 20])
    assert_close_to_reference(args, device, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_fp64_inputs_are_exact(device):
    args, seed = make_inputs(dtype=torch.float64)
    assert_close_to_reference(args, device, seed)

