"""The stub ``mmcv._ext``: compiled-only mmcv ops fail clearly when called,
and mmcv's own deformable attention entry point runs msda_mm's op."""
import sys

import mmcv.ops
import pytest
import torch
from mmcv.ops import multi_scale_deform_attn
from mmcv.utils import ext_loader

import msda_mm
from msda_mm.compat import MMCV_LITE, ext_stub

pytestmark = pytest.mark.skipif(
    not MMCV_LITE, reason="a compiled mmcv._ext is installed: the stub is not used")


def test_stub_is_installed_and_reports_no_compiled_ops():
    assert isinstance(sys.modules["mmcv._ext"], ext_stub.CompiledOpsStub)
    assert not ext_loader.check_ops_exist()
    # mmcv.utils.collect_env() reports this; it must not raise.
    assert mmcv.ops.get_compiling_cuda_version() == "n/a"
    # Private names stay missing, as on any module (copy/pickle/inspect probe them).
    assert not hasattr(sys.modules["mmcv._ext"], "__path__")


def test_compiled_only_op_raises_naming_op_and_way_out():
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0]])
    scores = torch.tensor([0.9, 0.8])
    with pytest.raises(RuntimeError, match=r"mmcv op 'nms' needs compiled mmcv \(mmcv-full\)") \
            as info:
        mmcv.ops.nms(boxes, scores, 0.5)
    assert "TritonMSDeformAttn" in str(info.value)


def test_mmcv_function_apply_runs_msda_mm_op(reference_backend):
    # mmcv's module calls this entry point for CUDA tensors; on CPU the
    # routed op runs the reference, compared here with mmcv's own PyTorch path.
    torch.manual_seed(0)
    shapes = torch.tensor([[4, 3], [2, 2]])
    level_start = torch.tensor([0, 12])
    value = torch.randn(2, 16, 2, 4, requires_grad=True)
    locations = torch.rand(2, 5, 2, 2, 3, 2)
    weights = torch.rand(2, 5, 2, 2, 3)
    function = multi_scale_deform_attn.MultiScaleDeformableAttnFunction
    out = function.apply(value, shapes, level_start, locations, weights, 64)
    expected = multi_scale_deform_attn.multi_scale_deformable_attn_pytorch(
        value, shapes, locations, weights)
    torch.testing.assert_close(out, expected)
    assert function.apply is msda_mm.multi_scale_deformable_attention
    out.sum().backward()
    assert value.grad is not None and value.grad.abs().sum() > 0
