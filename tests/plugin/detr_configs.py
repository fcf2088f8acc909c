"""mmdet's own Deformable-DETR, DINO and Mask2Former configs, shrunk for CPU
tests.

The backbone becomes an untrained ResNet-18 (no checkpoint download; the
configs' R50 / Swin-L would only slow the build), everything else, the
transformer included, is the config's.
"""
from __future__ import annotations

from pathlib import Path

import mmdet
from mmcv.ops import MultiScaleDeformableAttention
from mmdet.registry import MODELS
from mmengine import Config
from mmengine.registry import DefaultScope
from torch import nn

CONFIG_ROOT = Path(mmdet.__file__).parent / ".mim" / "configs"
DETR_CONFIGS = {
    "deformable-detr": "deformable_detr/deformable-detr_r50_16xb2-50e_coco.py",
    "deformable-detr-refine": "deformable_detr/deformable-detr-refine_r50_16xb2-50e_coco.py",
    "deformable-detr-refine-twostage":
        "deformable_detr/deformable-detr-refine-twostage_r50_16xb2-50e_coco.py",
    "dino-4scale": "dino/dino-4scale_r50_8xb2-12e_coco.py",
    "dino-5scale": "dino/dino-5scale_swin-l_8xb2-12e_coco.py",
}


def detr_model_cfg(name: str, attn_type: str | None = None) -> Config:
    """The ``model`` cfg of ``DETR_CONFIGS[name]`` with a ResNet-18 backbone
    and, if given, ``type=attn_type`` in every deformable-attention cfg
    (encoder self-attention, decoder cross-attention)."""
    model = Config.fromfile(CONFIG_ROOT / DETR_CONFIGS[name]).model
    # 4 levels: C3-C5 plus one extra conv in the neck; 5 levels: C2-C5 plus one.
    out_indices = (1, 2, 3) if model.get("num_feature_levels", 4) == 4 else (0, 1, 2, 3)
    model.backbone = dict(type="ResNet", depth=18, num_stages=4, out_indices=out_indices,
                          frozen_stages=1, norm_cfg=dict(type="BN", requires_grad=False),
                          norm_eval=True, style="pytorch", init_cfg=None)
    model.neck.in_channels = [64 * 2 ** i for i in out_indices]
    if attn_type is not None:
        model.encoder.layer_cfg.self_attn_cfg.type = attn_type
        model.decoder.layer_cfg.cross_attn_cfg.type = attn_type
    return model

MASK2FORMER_CONFIGS = {
    "instance": "mask2former/mask2former_r50_8xb2-lsj-50e_coco.py",
    "panoptic": "mask2former/mask2former_r50_8xb2-lsj-50e_coco-panoptic.py",
}


def mask2former_model_cfg(kind: str, attn_type: str | None = None) -> Config:
    """The ``model`` cfg of ``MASK2FORMER_CONFIGS[kind]`` with a ResNet-18
    backbone and, if given, ``type=attn_type`` in the pixel decoder's
    deformable attention (its only one)."""
    model = Config.fromfile(CONFIG_ROOT / MASK2FORMER_CONFIGS[kind]).model
    model.backbone.update(depth=18, init_cfg=None)
    model.panoptic_head.in_channels = [64 * 2 ** i for i in model.backbone.out_indices]
    if attn_type is not None:
        model.panoptic_head.pixel_decoder.encoder.layer_cfg.self_attn_cfg.type = attn_type
    return model


def build_detector(model_cfg: Config) -> nn.Module:
    # The configs' types are unscoped names in mmdet's registry, as under
    # a runner with default_scope='mmdet'.
    with DefaultScope.overwrite_default_scope("mmdet"):
        return MODELS.build(model_cfg)


def deformable_attentions(model: nn.Module) -> list[nn.Module]:
    """Every module DeformableDETR/DINO.init_weights treats as deformable attention."""
    return [m for m in model.modules() if isinstance(m, MultiScaleDeformableAttention)]
