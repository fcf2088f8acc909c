"""mmdet's Deformable-DETR and DINO configs with ``type='TritonMSDeformAttn'``
in every deformable attention, and without (mmcv's class, as before)."""
import pytest
import torch
from mmcv.ops import MultiScaleDeformableAttention

from msda_mm import TritonMSDeformAttn

from .detr_configs import DETR_CONFIGS, build_detector, deformable_attentions, detr_model_cfg
from .init_checks import assert_deformable_detr_init


def num_deformable_layers(model_cfg) -> int:
    # One in each encoder layer (self-attention), one in each decoder layer
    # (cross-attention).
    return model_cfg.encoder.num_layers + model_cfg.decoder.num_layers


@pytest.mark.parametrize("name", DETR_CONFIGS)
def test_type_builds_triton_attention_in_every_layer(name):
    model_cfg = detr_model_cfg(name, attn_type="TritonMSDeformAttn")
    attentions = deformable_attentions(build_detector(model_cfg))
    assert len(attentions) == num_deformable_layers(model_cfg)
    assert all(type(m) is TritonMSDeformAttn for m in attentions)


@pytest.mark.parametrize("name", ["deformable-detr", "dino-4scale"])
def test_config_without_type_keeps_mmcv_class(name):
    model_cfg = detr_model_cfg(name)
    attentions = deformable_attentions(build_detector(model_cfg))
    assert len(attentions) == num_deformable_layers(model_cfg)
    assert all(type(m) is MultiScaleDeformableAttention for m in attentions)


@pytest.mark.parametrize("name", ["deformable-detr-refine-twostage", "dino-5scale"])
def test_model_init_weights_same_as_with_mmcv_attention(name, quiet_mmengine):
    # DeformableDETR/DINO.init_weights Xavier-initialises every encoder and
    # decoder matrix, then re-initialises the modules that are instances of
    # mmcv's class; TritonMSDeformAttn must get that second step too.
    models = {}
    for attn_type in (None, "TritonMSDeformAttn"):
        torch.manual_seed(0)
        models[attn_type] = build_detector(detr_model_cfg(name, attn_type))
        models[attn_type].init_weights()
    for attn in deformable_attentions(models["TritonMSDeformAttn"]):
        assert_deformable_detr_init(attn)
    # Swapping the type changes nothing else: with one seed, every weight of
    # the model is what it is with mmcv's class.
    mmcv_state = models[None].state_dict()
    ours_state = models["TritonMSDeformAttn"].state_dict()
    assert list(ours_state) == list(mmcv_state)
    for key, value in ours_state.items():
        torch.testing.assert_close(value, mmcv_state[key], rtol=0, atol=0, msg=key)
