"""msda_mm.parity.kernel_check.checked_calls (tools/parity.py kernels) on one
TritonMSDeformAttn under bf16 autocast on the CPU, the kernels in Triton's
interpreter: it checks the op's bf16 calls, only those, at most max_calls,
and leaves the module's op as it found it."""
import torch

from msda_mm import TritonMSDeformAttn
from msda_mm.models import triton_ms_deform_attn
from msda_mm.parity.kernel_check import checked_calls

ARGS = dict(embed_dims=32, num_heads=2, num_levels=2, num_points=2, batch_first=True)


def _attend(module, autocast=True):
    torch.manual_seed(0)
    shapes = torch.tensor([[4, 3], [2, 2]])
    query, value = torch.randn(1, 5, 32), torch.randn(1, 16, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return module(query, value=value, reference_points=torch.rand(1, 5, 2, 2),
                      spatial_shapes=shapes)


def _module():
    torch.manual_seed(1)
    module = TritonMSDeformAttn(**ARGS)
    with torch.no_grad():  # mmcv's init zeroes the offsets and logits: randomise
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return module


def test_bf16_calls_are_checked_up_to_max_calls_and_pass():
    module, op = _module(), triton_ms_deform_attn.multi_scale_deformable_attention
    with checked_calls(max_calls=1) as calls:
        first = _attend(module)
        _attend(module)
    # One call checked, with fp32 accumulation only: the interpreter has no bf16 atomics.
    assert [(c["call"], c["fp32_grad_accum"]) for c in calls] == [(0, True)]
    assert calls[0]["passed"], calls
    assert calls[0]["value"] == [1, 16, 2, 16] and calls[0]["locations"] == [1, 5, 2, 2, 2, 2]
    assert calls[0]["location_dtype"] == "torch.float32"
    assert triton_ms_deform_attn.multi_scale_deformable_attention is op
    # The calls themselves are the op's own.
    assert torch.equal(first, _attend(module))


def test_fp32_calls_are_not_checked():
    with checked_calls() as calls:
        _attend(_module(), autocast=False)
    assert calls == []
