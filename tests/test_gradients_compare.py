"""msda_mm.parity.gradients (tools/parity.py grads) on one TritonMSDeformAttn
under bf16 autocast on the CPU (the PyTorch reference backend)."""
import math

import pytest
import torch
from torch import nn

from msda_mm import TritonMSDeformAttn
from msda_mm.models import triton_ms_deform_attn
from msda_mm.parity import gradients

ARGS = dict(embed_dims=32, num_heads=4, num_levels=2, num_points=3, batch_first=True)


def _model_and_loss():
    torch.manual_seed(0)
    model = nn.ModuleDict(dict(attn=TritonMSDeformAttn(**ARGS)))
    with torch.no_grad():  # mmcv's init zeroes the offsets and logits: randomise
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    shapes = torch.tensor([[6, 4], [3, 2]])
    query, value = torch.randn(2, 7, 32), torch.randn(2, 30, 32)
    reference_points = torch.rand(2, 7, 2, 2)

    def loss():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model["attn"](query, value=value, reference_points=reference_points,
                                spatial_shapes=shapes)
        return out.float().square().mean()

    return model, loss


@pytest.mark.parametrize("bf16_error", [0.0, 0.01])
def test_gradients_differ_exactly_when_the_op_does(reference_backend, monkeypatch, bf16_error):
    # The reference samples in fp32 and rounds once, as the kernels do, so
    # fp32_compute changes nothing there; an op whose bf16 path is off by
    # bf16_error must show up in the gradients feeding it.
    op = triton_ms_deform_attn.multi_scale_deformable_attention

    def op_with_bf16_error(value, *args, **kwargs):
        out = op(value, *args, **kwargs)
        return out * (1 + bf16_error) if value.dtype == torch.bfloat16 else out

    monkeypatch.setattr(triton_ms_deform_attn, "multi_scale_deformable_attention",
                        op_with_bf16_error)
    model, loss = _model_and_loss()
    report = gradients.compare(model, loss, lambda: torch.manual_seed(1))
    rows = {r["parameter"]: r for r in report["parameters"]}
    assert set(rows) == {n for n, _ in model.named_parameters()}
    assert all(r["floor"] == 0 for r in rows.values())  # the CPU reference is deterministic
    for comparison in ("fp32_compute", "bf16_value"):  # against bf16 values, either way
        moved = rows["attn.value_proj.weight"][comparison]
        assert (moved > 1e-3) if bf16_error else (moved == 0), comparison
    assert report["parameters"][0]["fp32_compute"] == report["summary"]["fp32_compute"]["max"]
    assert set(report["losses"]) == set(gradients.PASSES)
    # Restored.
    assert not model["attn"].fp32_compute and model["attn"].fp32_grad_accum is None


def test_relative_difference_keeps_nan_and_zero():
    nan, zeros = torch.tensor([float("nan")]), torch.zeros(1)
    # A NaN on either side is NaN (a check comparing it to a tolerance fails),
    # two zero tensors agree exactly.
    assert math.isnan(gradients.relative_difference(zeros, nan))
    assert math.isnan(gradients.relative_difference(nan, zeros))
    assert gradients.relative_difference(torch.zeros(3), torch.zeros(3)) == 0.0
    moved = gradients.relative_difference(torch.ones(2), torch.full((2,), 1.25))
    assert moved == pytest.approx(0.2)
