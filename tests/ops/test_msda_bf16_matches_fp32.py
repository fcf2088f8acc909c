"""The bf16 kernels compute what the fp32 kernels compute, on the same values
(msda_mm/parity/kernel_check.py says why and within what), on random inputs:
in the interpreter at small shapes, and marked gpu at DINO's training shapes.

Why this is a test of its own: in DINO trainings without an LR warmup
(benchmarks/e2e/ap_no_warmup) runs with the op on bf16 values lagged
behind runs with the op fed fp32 values.  It holds on the H200, as does the
same check on every MSDA call of a real training batch (tools/parity.py
kernels); more seeds showed the lag in both kinds of run.
"""
import pytest
import torch

from msda_mm.ops.tiles import tile_override
from msda_mm.parity.kernel_check import compare_to_fp32

from msda_inputs import make_inputs


def _inputs(B, Q, M, D, shapes, K, device):
    """Op arguments with a bf16 value and fp32 locations (mostly inside the
    image, some off its edges, as trained offsets) and weights, as under
    bf16 AMP; and a bf16 grad_output."""
    args, _ = make_inputs(B=B, Q=Q, M=M, D=D, shapes=shapes, K=K, dtype=torch.bfloat16,
                          loc_dtype=torch.float32, attn_dtype=torch.float32, lo=-0.1, hi=1.1,
                          device=device, seed=0)
    grad_out = torch.randn(B, Q, M * D, generator=torch.Generator().manual_seed(1))
    return args, grad_out.bfloat16().to(device)


def _assert_bf16_matches_fp32(args, grad_out, fp32_grad_accum):
    result = compare_to_fp32(args, grad_out, fp32_grad_accum)
    assert result["passed"], f"bf16 kernels against fp32 kernels: {result}"


@pytest.mark.parametrize("kernel", ["fwd", "pairs"])
def test_interpreted_bf16_kernels_match_fp32(kernel):
    # Small shapes for the interpreter; "pairs" sends the forward to
    # msda_fwd_pairs_kernel, which the GPU uses for the encoder's grids.
    inputs = _inputs(B=1, Q=9, M=2, D=32, shapes=((6, 5), (3, 3)), K=4, device="cpu")
    tiles = dict(pairs=(8, 1)) if kernel == "pairs" else {}
    with tile_override(**tiles):
        _assert_bf16_matches_fp32(*inputs, fp32_grad_accum=True)


@pytest.mark.parametrize("where", ["output", "grad_value", "grad_loc", "grad_attn",
                                   "nan_attn", "fp32_output"])
def test_an_op_off_by_bf16_arithmetic_fails(monkeypatch, where):
    # The check must catch what a kernel computing in bf16 would do: the
    # output or grad_value off by 2**-6 relative (two bf16 units or more),
    # a location or weight gradient off by 1e-4; and a NaN, and an output
    # in another dtype.
    from msda_mm.parity import kernel_check
    real = kernel_check.forward_backward
    change = {"output": lambda r: (r[0] * (1 + 2.0**-6), *r[1:]),
              "grad_value": lambda r: (r[0], r[1] * (1 + 2.0**-6), *r[2:]),
              "grad_loc": lambda r: (*r[:2], r[2] * (1 + 1e-4), r[3]),
              "grad_attn": lambda r: (*r[:3], r[3] * (1 + 1e-4)),
              "nan_attn": lambda r: (*r[:3], r[3] * float("nan")),
              "fp32_output": lambda r: (r[0].float(), *r[1:])}[where]

    def off(args, value, grad_out, fp32_grad_accum):
        result = real(args, value, grad_out, fp32_grad_accum)
        return change(result) if value.dtype == torch.bfloat16 else result

    monkeypatch.setattr(kernel_check, "forward_backward", off)
    inputs = _inputs(B=1, Q=5, M=2, D=32, shapes=((4, 4), (2, 2)), K=2, device="cpu")
    assert not compare_to_fp32(*inputs, fp32_grad_accum=True)["passed"]


def test_needs_a_bf16_value():
    args, grad_out = _inputs(B=1, Q=2, M=1, D=8, shapes=((2, 2),), K=1, device="cpu")
    with pytest.raises(TypeError, match="bf16 value"):
        compare_to_fp32(dict(args, value=args["value"].float()), grad_out, True)


@pytest.mark.gpu
@pytest.mark.parametrize("fp32_grad_accum", [True, False], ids=["fp32_accum", "native"])
@pytest.mark.parametrize("layer,Q", [("encoder", None), ("decoder", 400)])
def test_bf16_kernels_match_fp32_at_dino_training_shapes(layer, Q, fp32_grad_accum):
    """benchmarks/e2e/ap_no_warmup's shapes: batch 16 of 512 x 512 images (strides
    8-64), 8 heads of 32 channels, 4 points a level; the encoder's queries
    are its S positions (the pairs forward), the decoder's 100 queries plus
    denoising ones."""
    shapes = ((64, 64), (32, 32), (16, 16), (8, 8))
    S = sum(h * w for h, w in shapes)
    inputs = _inputs(B=16, Q=Q or S, M=8, D=32, shapes=shapes, K=4, device="cuda")
    _assert_bf16_matches_fp32(*inputs, fp32_grad_accum=fp32_grad_accum)
