"""Honour ``type`` in the deformable-attention configs of mmdet's
Deformable-DETR, DINO and Grounding-DINO layers.

``DeformableDetrTransformerEncoderLayer._init_layers`` (``self_attn_cfg``)
and ``DeformableDetrTransformerDecoderLayer._init_layers``
(``cross_attn_cfg``; DINO's decoder reuses this layer), and
``GroundingDinoTransformerDecoderLayer._init_layers`` (``cross_attn_cfg``)
construct the attention as ``MultiScaleDeformableAttention(**cfg)``, so a
``type`` key is a ``TypeError``.  Those modules use the name for nothing but
these constructions, so rebinding it to a builder changes exactly them: a cfg with
``type`` is built through mmdet's ``MODELS``, one without still constructs
mmcv's class with the same arguments.

Rebinding the name, rather than wrapping ``_init_layers`` to rebuild the
attention afterwards, constructs each attention once: the layer's other
modules and the random stream are untouched, so a seed gives the same
weights with and without the type swap.
"""
from __future__ import annotations

from mmcv.ops import MultiScaleDeformableAttention
from mmdet.models.layers.transformer import deformable_detr_layers, grounding_dino_layers
from mmdet.registry import MODELS
from torch import nn


def build_deformable_attention(**cfg) -> nn.Module:
    """The attention of a Deformable-DETR/DINO layer from its cfg: through
    ``MODELS`` when the cfg names a ``type``, mmcv's class otherwise."""
    if "type" in cfg:
        return MODELS.build(cfg)
    return MultiScaleDeformableAttention(**cfg)


def honour_attention_type() -> None:
    for layers in (deformable_detr_layers, grounding_dino_layers):
        layers.MultiScaleDeformableAttention = build_deformable_attention
