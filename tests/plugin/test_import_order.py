"""``import msda_mm`` makes mmdet importable on mmcv-lite and applies its
routing whichever of mmcv, mmdet and msda_mm the user imported first.

Each case runs in a fresh interpreter: import order is process state.
"""
import subprocess
import sys
import textwrap

import pytest

from msda_mm.compat import MMCV_LITE

mmcv_lite_only = pytest.mark.skipif(
    not MMCV_LITE, reason="a compiled mmcv._ext is installed: mmcv-lite support is not used")

# What every import order must end in.
CHECK_APPLIED = """
import mmcv.cnn.bricks.transformer as transformer
import mmdet.models
from mmcv.ops import MultiScaleDeformableAttention, multi_scale_deform_attn
from mmdet.models.detectors import deformable_detr
from mmdet.models.layers.transformer import deformable_detr_layers as layers
from mmdet.models.losses import focal_loss
from mmdet.registry import MODELS

import msda_mm
from msda_mm.compat.focal_loss import sigmoid_focal_loss_from_labels

assert msda_mm.compat.MMCV_LITE
assert transformer.MultiScaleDeformableAttention is MultiScaleDeformableAttention
assert deformable_detr.MultiScaleDeformableAttention is MultiScaleDeformableAttention
assert multi_scale_deform_attn.MultiScaleDeformableAttnFunction.apply \\
    is msda_mm.multi_scale_deformable_attention
assert focal_loss._sigmoid_focal_loss is sigmoid_focal_loss_from_labels
assert MODELS.get("TritonMSDeformAttn") is msda_mm.TritonMSDeformAttn
layer = layers.DeformableDetrTransformerEncoderLayer(
    self_attn_cfg=dict(type="TritonMSDeformAttn", embed_dims=32, num_heads=4))
assert type(layer.self_attn) is msda_mm.TritonMSDeformAttn
print("APPLIED")
"""


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


def assert_ok(proc: subprocess.CompletedProcess, marker: str) -> None:
    assert proc.returncode == 0 and marker in proc.stdout, proc.stdout + proc.stderr[-3000:]


@mmcv_lite_only
@pytest.mark.parametrize("first", [
    "",
    "import mmcv.cnn.bricks.transformer",
    # Also the control: without msda_mm, mmcv-lite cannot import mmdet.models.
    # The failed attempt leaves half of mmdet.models in sys.modules.
    "try:\n    import mmdet.models\nexcept ImportError as e:\n"
    "    assert 'mmcv._ext' in str(e), e\nelse:\n    raise AssertionError('imported')",
], ids=["msda_mm-first", "mmcv-transformer-first", "failed-mmdet-first"])
def test_any_import_order_gets_the_plugin(first):
    assert_ok(run_python(first + "\nimport msda_mm\n" + CHECK_APPLIED), "APPLIED")


def test_import_leaves_the_mmcv_kernel_builder_unloaded():
    # The builder of mmcv's CUDA kernels and its sdist reader load only when
    # a build or the MSDA_MM_MMCV_CUDA switch uses them.
    proc = run_python("""
        import os, sys
        os.environ.pop("MSDA_MM_MMCV_CUDA", None)
        import msda_mm
        builder = ("msda_mm.compat.mmcv_cuda_build", "msda_mm.compat.mmcv_sdist")
        assert "msda_mm.compat" in sys.modules
        loaded = [name for name in builder if name in sys.modules]
        assert not loaded, loaded
        print("UNLOADED")
    """)
    assert_ok(proc, "UNLOADED")


def test_compiled_mmcv_is_left_alone():
    # A stand-in for a real compiled mmcv._ext, imported before msda_mm: msda_mm
    # must not stub, route or patch anything of mmcv's, only register its module.
    proc = run_python("""
        import importlib.machinery, sys, types

        class CompiledExt(types.ModuleType):
            def __getattr__(self, name):
                if name.startswith("_"):
                    raise AttributeError(name)
                return lambda *args, **kwargs: "compiled " + name

        ext = CompiledExt("mmcv._ext")
        ext.__spec__ = importlib.machinery.ModuleSpec("mmcv._ext", loader=None)
        sys.modules["mmcv._ext"] = ext

        import msda_mm
        import mmcv.ops
        from mmcv.ops import multi_scale_deform_attn
        from mmdet.models.layers.transformer import deformable_detr_layers as layers
        from mmdet.models.losses import focal_loss
        from mmdet.registry import MODELS

        assert not msda_mm.compat.MMCV_LITE
        assert sys.modules["mmcv._ext"] is ext
        assert "apply" not in vars(multi_scale_deform_attn.MultiScaleDeformableAttnFunction)
        assert focal_loss._sigmoid_focal_loss is mmcv.ops.sigmoid_focal_loss
        assert mmcv.ops.nms.__module__ == "mmcv.ops.nms"
        assert MODELS.get("TritonMSDeformAttn") is msda_mm.TritonMSDeformAttn
        layer = layers.DeformableDetrTransformerDecoderLayer(
            cross_attn_cfg=dict(type="TritonMSDeformAttn", embed_dims=32, num_heads=4))
        assert type(layer.cross_attn) is msda_mm.TritonMSDeformAttn
        print("UNTOUCHED")
    """)
    assert_ok(proc, "UNTOUCHED")
