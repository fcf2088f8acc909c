"""Random MSDA inputs and the accuracy check shared by the operator tests."""
from __future__ import annotations

import random

import pytest
import torch

from msda_mm import msda_reference, multi_scale_deformable_attention
from msda_mm.ops import point_softmax

# On the CPU the Triton kernels run in the interpreter (tests/conftest.py);
# the same tests run the compiled kernels on the GPU.
DEVICES = [pytest.param("cpu", id="interp"),
           pytest.param("cuda", marks=pytest.mark.gpu, id="cuda")]


def make_inputs(B=2, Q=5, M=2, D=8, shapes=((4, 5), (2, 3)), K=2, dtype=torch.float32,
                loc_dtype=None, attn_dtype=None, lo=-0.5, hi=1.5, device="cpu", seed=None):
    """Fresh random inputs; returns (kwargs for the op, seed used).

    Locations are uniform in [lo, hi] so some fall outside every level.
    """
    seed = random.randrange(2**31) if seed is None else seed
    g = torch.Generator().manual_seed(seed)
    spatial_shapes = torch.tensor(shapes, dtype=torch.int64)
    L = len(shapes)
    S = int((spatial_shapes[:, 0] * spatial_shapes[:, 1]).sum())
    value = torch.randn(B, S, M, D, generator=g)
    loc = lo + (hi - lo) * torch.rand(B, Q, M, L, K, 2, generator=g)
    attn = torch.rand(B, Q, M, L, K, generator=g)
    args = dict(
        value=value.to(device, dtype),
        spatial_shapes=spatial_shapes.to(device),
        level_start_index=None,
        sampling_locations=loc.to(device, loc_dtype or dtype),
        attention_weights=attn.to(device, attn_dtype or dtype),
    )
    return args, seed


def logit_inputs(scale=4.0, **kwargs):
    """make_inputs with attention logits uniform in [-scale, scale] (for softmax=True)."""
    args, seed = make_inputs(**kwargs)
    attn = args["attention_weights"]
    args["attention_weights"] = ((attn.double() * 2 - 1) * scale).to(attn.dtype)
    return args, seed


FLOAT_INPUTS = ("value", "sampling_locations", "attention_weights")


def run_op(args, fn=multi_scale_deformable_attention, grad_out=None, **kw):
    """Forward + backward of fn; returns (out, grads dict, grad_out)."""
    leaves = {k: args[k].detach().clone().requires_grad_() for k in FLOAT_INPUTS}
    out = fn(leaves["value"], args["spatial_shapes"], args["level_start_index"],
             leaves["sampling_locations"], leaves["attention_weights"], **kw)
    if grad_out is None:
        grad_out = torch.randn(out.shape, dtype=torch.float64).to(out)
    grads = torch.autograd.grad(out, [leaves[k] for k in FLOAT_INPUTS], grad_out.to(out))
    return out, dict(zip(FLOAT_INPUTS, grads)), grad_out


def reference_fn(value, spatial_shapes, level_start_index, loc, attn):
    """The pure-PyTorch reference, output rounded to value's dtype as the op's."""
    return msda_reference(value, spatial_shapes, loc, attn, level_start_index).to(value.dtype)


def softmax_reference(value, spatial_shapes, level_start_index, loc, logits):
    """The reference path of softmax=True: torch's softmax, then the reference."""
    return reference_fn(value, spatial_shapes, level_start_index, loc, point_softmax(logits))


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().cpu().double(), ref.detach().cpu().double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-300)).item()


# Error floor per dtype, for draws where the reference in that dtype happens
# to be (nearly) exact and the 2x rule alone would ask for more than rounding
# allows.  fp16/bf16: 4 units of roundoff of the stored result (2**-11,
# 2**-8).  fp32: 32 units (2**-24 each), since the gradient dot products over
# D x 4 corners (32+ terms) are summed in another order than the reference's
# (seen: up to 6e-7 over 40 random draws of the shapes used here).
FLOOR = {torch.float64: 1e-12, torch.float32: 32 * 2.0**-24, torch.float16: 4 * 2.0**-11,
         torch.bfloat16: 4 * 2.0**-8}


def assert_close_to_reference(args, device, seed, reference=reference_fn, **kw):
    """The op's output and three gradients vs fp64 truth: each relative error
    at most twice the pure-PyTorch ``reference``'s own error in the same
    dtypes (or the dtype's rounding floor).  ``kw`` goes to the op."""
    on_dev = {k: (v.to(device) if v is not None else None) for k, v in args.items()}
    out, grads, grad_out = run_op(on_dev, **kw)
    cpu = {k: (v.cpu() if v is not None else None) for k, v in args.items()}
    ref_out, ref_grads, _ = run_op(cpu, fn=reference, grad_out=grad_out.cpu())
    f64 = {k: (v.double() if k in FLOAT_INPUTS else v) for k, v in cpu.items()}
    true_out, true_grads, _ = run_op(f64, fn=reference, grad_out=grad_out.cpu().double())

    assert out.dtype == args["value"].dtype and out.device.type == device
    for name, ours, ref, truth in [("output", out, ref_out, true_out)] + [
            (f"grad_{k}", grads[k], ref_grads[k], true_grads[k]) for k in FLOAT_INPUTS]:
        assert ours.dtype == ref.dtype, (name, ours.dtype, ref.dtype)
        bound = max(2 * rel_err(ref, truth), FLOOR[ours.dtype])
        err = rel_err(ours, truth)
        assert err <= bound, f"{name}: rel err {err:.3g} > {bound:.3g} (seed {seed})"
