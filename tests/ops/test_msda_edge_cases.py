"""Out-of-range, non-finite and empty inputs."""
import pytest
import torch

from msda_mm import msda_reference

from msda_inputs import DEVICES, FLOAT_INPUTS, make_inputs, run_op


def _on(args, device):
    return {k: (v.to(device) if v is not None else None) for k, v in args.items()}


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_locations_sample_zero(device):
    args, seed = make_inputs(lo=1.5, hi=3.0)
    args["sampling_locations"][..., 1] *= -1  # y far above the image, x far right
    out, grads, _ = run_op(_on(args, device))
    assert torch.count_nonzero(out) == 0, f"seed {seed}"
    for k in FLOAT_INPUTS:
        assert torch.count_nonzero(grads[k]) == 0, (k, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_locations_contribute_zero(device, bad):
    args, seed = make_inputs(B=1, Q=4, M=1, D=8, lo=0.0, hi=1.0)
    poisoned = {k: v.clone() if v is not None else None for k, v in args.items()}
    # Query 0 gets a non-finite x for point (level 0, k 0); query 1 a
    # non-finite y.  Zeroing those points' weights must give the same result.
    poisoned["sampling_locations"][0, 0, 0, 0, 0, 0] = bad
    poisoned["sampling_locations"][0, 1, 0, 0, 0, 1] = bad
    expected = {k: v.clone() if v is not None else None for k, v in args.items()}
    expected["attention_weights"][0, :2, 0, 0, 0] = 0
    out, grads, g = run_op(_on(poisoned, device))
    ref_out, ref_grads, _ = run_op(_on(expected, device), grad_out=g)
    assert torch.isfinite(out).all() and all(torch.isfinite(t).all() for t in grads.values())
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(grads["value"], ref_grads["value"])
    bad_points = [(0, 0, 0, 0, 0), (0, 1, 0, 0, 0)]
    for p in bad_points:
        assert torch.count_nonzero(grads["sampling_locations"][p]) == 0
        assert grads["attention_weights"][p] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_nan_in_value_propagates(device):
    args, seed = make_inputs(B=1, Q=3, M=1, D=4, shapes=((2, 2),), K=1, lo=0.0, hi=1.0)
    args["value"][0, :, 0, 1] = float("nan")  # channel 1 everywhere
    out = run_op(_on(args, device))[0].cpu()
    assert torch.isnan(out[..., 1]).all(), f"seed {seed}"
    assert torch.isfinite(out[..., [0, 2, 3]]).all(), f"seed {seed}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,Q", [(0, 5), (2, 0)])
def test_empty_batch_or_queries(device, B, Q):
    args, _ = make_inputs(B=B, Q=Q)
    out, grads, _ = run_op(_on(args, device))
    assert out.shape == (B, Q, 2 * 8)
    for k in FLOAT_INPUTS:
        assert grads[k].shape == args[k].shape and torch.count_nonzero(grads[k]) == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", [((4, 5), (3, 3)),  # the last level runs 3 rows past S
                                    ((4, 5), (40000, 60000))])  # y * W wraps int32
# fp32 through msda_fwd_kernel; bf16 forced through msda_fwd_pairs_kernel.
@pytest.mark.parametrize("dtype,tiles", [(torch.float32, {}),
                                         (torch.bfloat16, dict(pairs=(4, 1)))], ids=["", "pairs"])
def test_kernels_never_read_past_value_for_shapes_that_disagree(device, shapes, dtype, tiles):
    # On CUDA the op cannot check spatial_shapes against value's S without a
    # sync (on CPU it raises first), so the kernels are called directly: a
    # corner past S reads zero and receives nothing, as if value were
    # zero-padded, and none is read or written out of bounds.
    from msda_mm.ops.backward.launcher import launch_backward
    from msda_mm.ops.forward.launcher import launch_forward
    from msda_mm.ops.tiles import Tiles
    args, seed = make_inputs(B=1, Q=6, M=2, D=8, shapes=((4, 5), (2, 3)), K=2, lo=0.0, hi=1.0,
                             dtype=dtype, loc_dtype=torch.float32, attn_dtype=torch.float32)
    S = 4 * 5 + 6  # value covers level 0 and 6 positions of level 1
    shapes_t = torch.tensor(shapes)
    value, loc, attn = args["value"], args["sampling_locations"], args["attention_weights"]
    grad_out = torch.randn(1, 6, 16, dtype=dtype)
    on = [t.to(device) for t in (value, shapes_t, loc, attn, grad_out)]
    out = launch_forward(*on[:4], tiles=Tiles(**tiles))
    grad_value = launch_backward(on[4], *on[:4], True, tiles=Tiles(**tiles))[0]
    assert torch.isfinite(out).all() and torch.isfinite(grad_value).all(), f"seed {seed}"
    if shapes[1][0] < 100:  # where no index wraps, the numbers of a zero-padded value
        padded = torch.zeros(1, 20 + shapes[1][0] * shapes[1][1], 2, 8)
        padded[:, :S] = value.float()
        ref = msda_reference(padded, shapes_t, loc, attn).to(dtype)
        torch.testing.assert_close(out.cpu(), ref, msg=f"seed {seed}")
