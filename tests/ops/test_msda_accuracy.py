"""Forward and all three gradients against the fp64 reference.

CPU: the Triton kernels in the interpreter.  GPU (-m gpu): compiled kernels.
"""
import pytest
import torch

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
    at the fp32 location it was given, not at a rounded one."""
    args, seed = make_inputs(B=1, Q=4, M=1, D=4, shapes=((3, 200),), K=1, dtype=torch.bfloat16,
                             loc_dtype=torch.float32, attn_dtype=torch.float32, lo=0.3, hi=0.7)
    args["value"] = torch.arange(600.0).view(1, 600, 1, 1).expand(1, 600, 1, 4).to(torch.bfloat16)
    from msda_mm import multi_scale_deformable_attention as msda
    on_dev = {k: (v.to(device) if v is not None else None) for k, v in args.items()}
    out = msda(**on_dev).float().cpu()
    loc32 = args["sampling_locations"]
    out_rounded = msda(**{**on_dev, "sampling_locations": loc32.to(torch.bfloat16).to(device)})
    # x * 200 - 0.5 indexes a ramp of step 1 along a row: the output is the
    # fractional pixel position itself (up to the bf16 rounding of values >= 256).
    assert not torch.equal(out, out_rounded.float().cpu()), f"seed {seed}"
    assert_close_to_reference(args, device, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("Q", [1, 17, 33])
def test_query_count_not_multiple_of_tile(device, Q):
    args, seed = make_inputs(Q=Q)
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
        loc[..., lvl, :, 0] = (torch.randint(0, w + 1, loc[..., lvl, :, 0].shape, generator=g) + shift) / w
        loc[..., lvl, :, 1] = (torch.randint(0, h + 1, loc[..., lvl, :, 1].shape, generator=g) + shift) / h
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
def test_level_start_index_given_or_derived(device):
    args, seed = make_inputs()
    args["level_start_index"] = torch.tensor([0, 20])
    assert_close_to_reference(args, device, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_fp64_inputs_are_exact(device):
    args, seed = make_inputs(dtype=torch.float64)
    assert_close_to_reference(args, device, seed)
