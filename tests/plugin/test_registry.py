"""TritonMSDeformAttn resolves through mmdet's MODELS registry."""
import mmengine.registry
from mmcv.ops import MultiScaleDeformableAttention
from mmdet.registry import MODELS
from mmengine.registry import DefaultScope

from msda_mm import TritonMSDeformAttn
from msda_mm.compat.mmdet_layers import build_deformable_attention

CFG = dict(type="TritonMSDeformAttn", embed_dims=32, num_heads=4, num_levels=2, num_points=3)


def test_mmdet_registry_builds_it():
    assert MODELS.get("TritonMSDeformAttn") is TritonMSDeformAttn
    attn = MODELS.build(CFG)
    assert type(attn) is TritonMSDeformAttn
    assert (attn.embed_dims, attn.num_heads, attn.num_levels, attn.num_points) == (32, 4, 2, 3)


def test_root_registry_under_default_scope_mmdet():
    # How a runner with default_scope='mmdet' (every mmdet config) builds it.
    with DefaultScope.overwrite_default_scope("mmdet"):
        assert type(mmengine.registry.MODELS.build(CFG)) is TritonMSDeformAttn
    # Without a scope, the scoped name still finds it.
    scoped = {**CFG, "type": "mmdet.TritonMSDeformAttn"}
    assert type(mmengine.registry.MODELS.build(scoped)) is TritonMSDeformAttn


def test_layer_attention_builder():
    assert type(build_deformable_attention(**CFG)) is TritonMSDeformAttn
    typeless = {k: v for k, v in CFG.items() if k != "type"}
    assert type(build_deformable_attention(**typeless)) is MultiScaleDeformableAttention
    with DefaultScope.overwrite_default_scope("mmdet"):
        mmcv_type = {**CFG, "type": "MultiScaleDeformableAttention"}
        assert type(build_deformable_attention(**mmcv_type)) is MultiScaleDeformableAttention


def test_grounding_dino_decoder_layer_honours_type():
    from mmdet.models.layers.transformer.grounding_dino_layers import (
        GroundingDinoTransformerDecoderLayer,
    )
    attn = dict(embed_dims=256, num_levels=4, batch_first=True)
    layer = GroundingDinoTransformerDecoderLayer(
        cross_attn_cfg={**attn, "type": "TritonMSDeformAttn"})
    assert type(layer.cross_attn) is TritonMSDeformAttn
    plain = GroundingDinoTransformerDecoderLayer(cross_attn_cfg=attn)
    assert type(plain.cross_attn) is MultiScaleDeformableAttention
