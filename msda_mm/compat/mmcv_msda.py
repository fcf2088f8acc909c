"""Route mmcv's own multi-scale deformable attention to msda_mm's op (mmcv-lite only).

``mmcv.ops.MultiScaleDeformableAttention.forward`` sends CUDA tensors to
``MultiScaleDeformableAttnFunction.apply``, whose compiled kernels mmcv-lite
lacks.  Replacing that one entry point (same positional arguments) gives a
config that keeps mmcv's class, i.e. names no ``type``, the Triton kernels;
CPU tensors keep mmcv's PyTorch path, which never reaches ``apply``.
"""
from __future__ import annotations

import sys

from mmcv.ops import multi_scale_deform_attn

from ..ops import multi_scale_deformable_attention

_TRANSFORMER = "mmcv.cnn.bricks.transformer"


def route_function_to_triton() -> None:
    """``MultiScaleDeformableAttnFunction.apply(value, spatial_shapes,
    level_start_index, sampling_locations, attention_weights, im2col_step)``
    -> ``msda_mm.ops.multi_scale_deformable_attention`` (differentiable)."""
    multi_scale_deform_attn.MultiScaleDeformableAttnFunction.apply = staticmethod(
        multi_scale_deformable_attention)


def restore_transformer_export() -> None:
    """``mmcv.cnn.bricks.transformer`` re-exports the attention class, which
    mmdet's Deformable-DETR imports from there; if that module was imported
    before the stub existed, its guarded import failed and left the name out."""
    transformer = sys.modules.get(_TRANSFORMER)
    if transformer is not None and not hasattr(transformer, "MultiScaleDeformableAttention"):
        transformer.MultiScaleDeformableAttention = \
            multi_scale_deform_attn.MultiScaleDeformableAttention
