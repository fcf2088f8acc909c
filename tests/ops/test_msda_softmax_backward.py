"""softmax=True in the backward: the default backward takes the softmax and
its gradient inside msda_bwd_kernel (one launch, no PyTorch softmax); the
deterministic one runs on point_softmax's weights.  Gradients against
point_softmax followed by the reference, on the paths the forward's tests
(test_msda_softmax.py) leave out: backward tiles with masked queries and
several chunks, -inf logits, gradients for nearly equal weights, and the
deterministic backward."""
import pytest
import torch

from msda_mm.ops import op as op_module
from msda_mm.ops.backward import launcher as backward_launcher
from msda_mm.ops.backward.launcher import launch_backward
from msda_mm.ops.tiles import TUNED, tile_override

from msda_inputs import (
    DEVICES,
    FLOAT_INPUTS,
    FLOOR,
    assert_close_to_reference,
    logit_inputs,
    rel_err,
    run_op,
    softmax_reference,
)


def _on(args, device):
    return {k: (v.to(device) if v is not None else None) for k, v in args.items()}


class _BackwardSpy:
    """Stands in for msda_bwd_kernel: records each launch's SOFTMAX, its
    weights and its grad_attn / grad_logit buffers, then runs it."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch_(*args, **kwargs):
            self.launches.append(dict(softmax=kwargs["SOFTMAX"], weights=args[4],
                                      grad_attn=args[7], grad_logit=args[8]))
            return self.kernel[grid](*args, **kwargs)
        return launch_


@pytest.fixture
def spy(monkeypatch):
    spy = _BackwardSpy(backward_launcher.msda_bwd_kernel)
    monkeypatch.setattr(backward_launcher, "msda_bwd_kernel", spy)
    return spy


@pytest.mark.parametrize("attn_dtype,g_dtype", [(torch.bfloat16, torch.float32),
                                                (torch.float32, torch.float32),
                                                (torch.float64, torch.float64)], ids=str)
def test_default_backward_is_one_kernel(spy, monkeypatch, attn_dtype, g_dtype):
    # No PyTorch softmax anywhere: the kernel gets the logits, keeps g for the
    # weights in fp32 at least (a scratch for 16-bit logits, else the result).
    monkeypatch.setattr(op_module, "point_softmax", None)
    args, _ = logit_inputs(attn_dtype=attn_dtype)
    _, grads, _ = run_op(args, softmax=True)
    (only,) = spy.launches
    assert only["softmax"] is True
    assert torch.equal(only["weights"], args["attention_weights"])
    assert only["grad_attn"].dtype == g_dtype
    assert (only["grad_attn"] is only["grad_logit"]) == (g_dtype == attn_dtype)
    assert only["grad_logit"].data_ptr() == grads["attention_weights"].data_ptr()


def test_deterministic_backward_runs_on_the_softmax_weights(spy):
    args, _ = logit_inputs()
    run_op(args, softmax=True, deterministic=True)
    (only,) = spy.launches
    assert only["softmax"] is False and only["grad_logit"] is None
    torch.testing.assert_close(only["weights"], op_module.point_softmax(
        args["attention_weights"]), rtol=0, atol=0)


def test_launcher_refuses_softmax_with_deterministic():
    args, _ = logit_inputs()
    with pytest.raises(ValueError, match="softmax=True takes the float-atomic backward only"):
        launch_backward(torch.zeros(2, 5, 16), args["value"], args["spatial_shapes"],
                        args["sampling_locations"], args["attention_weights"],
                        fp32_grad_accum=False, deterministic=True, softmax=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomics", "fixed_point"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_backward_tiles_with_masked_queries_and_chunks(device, dtype, deterministic):
    # 4 queries x 4 points a backward program over Q = 7 and 10 points:
    # masked query rows, three chunks (the max, sum and last passes too), the
    # last one half empty.
    args, seed = logit_inputs(B=2, Q=7, M=2, D=8, shapes=((4, 5), (2, 3)), K=5, dtype=dtype,
                              loc_dtype=torch.float32)
    with tile_override(bwd=(4, 1, 4)):
        assert_close_to_reference(args, device, seed, reference=softmax_reference, softmax=True,
                                  deterministic=deterministic)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomics", "fixed_point"])
def test_minus_inf_logits_get_zero_gradient(device, deterministic):
    # A -inf logit weighs exactly 0: its gradient is exactly 0, and the other
    # gradients are the reference's (fp64: rounding-level, 1e-10).
    args, seed = logit_inputs(B=1, Q=6, M=2, D=8, K=3, dtype=torch.float64)
    logits = args["attention_weights"]
    logits[0, 1, 0, 0, 1:] = -float("inf")
    logits[0, 2, 1, 1] = -float("inf")
    logits[0, 4, :, :, 0] = -float("inf")
    on = _on(args, device)
    with tile_override(bwd=(4, 1, 4)):
        out, grads, g = run_op(on, softmax=True, deterministic=deterministic)
    _, want, _ = run_op(args, fn=softmax_reference, grad_out=g.cpu())
    assert torch.equal(grads["attention_weights"].cpu()[logits == -float("inf")],
                       torch.zeros(int((logits == -float("inf")).sum()), dtype=torch.float64))
    for k in FLOAT_INPUTS:
        torch.testing.assert_close(grads[k].cpu(), want[k], rtol=1e-10, atol=1e-12,
                                   msg=lambda m, k=k: f"{k} (seed {seed}): {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_nearly_equal_weight_gradients_keep_their_differences(device):
    # value nearly constant, locations whose four corners are all inside
    # their level: the gradient g of every weight is about the same c, and the
    # logits' p * (g - sum(p * g)) keeps only the differences, ~1e-3 c.  g
    # rounded to the bf16 logits' dtype (2**-9 c) before the subtraction
    # swamps them (relative error ~14 against this bound of ~0.016); the
    # kernel keeps g in fp32, as the reference does, and only the final bf16
    # rounding remains.  (Only this gradient: the
    # locations' one cancels in fp32 here, the kernel's as without softmax.)
    args, seed = logit_inputs(B=1, Q=6, M=2, D=8, K=3, attn_dtype=torch.bfloat16,
                              lo=0.3, hi=0.7)
    args["value"] = 1 + 1e-3 * args["value"]
    _, grads, g = run_op(_on(args, device), softmax=True)
    _, ref, _ = run_op(args, fn=softmax_reference, grad_out=g.cpu())
    f64 = {k: (v.double() if k in FLOAT_INPUTS else v) for k, v in args.items()}
    _, truth, _ = run_op(f64, fn=softmax_reference, grad_out=g.cpu().double())
    name = "attention_weights"
    bound = max(2 * rel_err(ref[name], truth[name]), FLOOR[torch.bfloat16])
    err = rel_err(grads[name], truth[name])
    assert err <= bound, f"rel err {err:.3g} > {bound:.3g} (seed {seed})"


@pytest.mark.parametrize("device", DEVICES)
def test_wide_head_with_fp32_logits_in_place(device):
    # D = 256: the backward takes 4 warps for a 1 x 4 tile of points, so each
    # logit's gradient has copies in several warps; fp32 logits take g in their
    # own gradient buffer, read and overwritten by the last pass.
    args, seed = logit_inputs(B=1, Q=3, M=1, D=256, shapes=((3, 4), (2, 2)), K=2)
    assert TUNED.tile("bwd", args["value"], 4, 3)["num_warps"] == 4
    assert_close_to_reference(args, device, seed, reference=softmax_reference, softmax=True)
