"""mmcv-lite support and mmdet integration, applied once on import.

On mmcv-lite (no compiled ``mmcv._ext``):
  * a stub ``mmcv._ext`` makes ``mmcv.ops`` and so ``mmdet.models``
    importable; a compiled-only op raises a RuntimeError naming itself when
    called (``ext_stub``);
  * mmcv's ``MultiScaleDeformableAttnFunction.apply``, which its
    ``MultiScaleDeformableAttention`` calls for CUDA tensors, runs msda_mm's
    op (``mmcv_msda``);
  * mmdet's CUDA sigmoid-focal-loss path computes in PyTorch (``focal_loss``);
  * with MSDA_MM_MMCV_CUDA set, mmcv's module runs mmcv's own CUDA kernels,
    built from the user's mmcv sdist, instead (``mmcv_cuda_switch``).
With a compiled mmcv none of that happens: mmcv and mmdet stay untouched.

Always: ``type`` in the deformable-attention configs of mmdet's
Deformable-DETR/DINO layers is honoured (``mmdet_layers``).

Everything here edits module attributes that are read at call time, and
``mmdet.models`` is imported (after the stub is in place) to apply it, so
the result is the same whichever of mmcv, mmdet and msda_mm was imported
first.
"""
from . import ext_stub

MMCV_LITE = ext_stub.install()

# isort: split
# These import mmcv.ops, which needs the stub.
from . import mmcv_cuda_switch, mmcv_msda  # noqa: E402
from .mmcv_cuda_switch import mmcv_cuda_msda, use_mmcv_cuda_msda, use_triton_msda  # noqa: E402

if MMCV_LITE:
    # First: mmdet.models, imported next, takes the class from there.
    mmcv_msda.restore_transformer_export()
    mmcv_msda.route_function_to_triton()

from . import focal_loss, mmdet_layers  # noqa: E402  (import mmdet.models)

if MMCV_LITE:
    focal_loss.route_to_pytorch()
    mmcv_cuda_switch.apply_env()
mmdet_layers.honour_attention_type()

__all__ = ["MMCV_LITE", "mmcv_cuda_msda", "use_mmcv_cuda_msda", "use_triton_msda"]
