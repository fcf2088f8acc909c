# Deformable DETR R50 on COCO (data/coco/), fp32, with msda_mm's Triton op
# in every multi-scale deformable attention: the fp32 twin of
# deformable_detr_bf16.py.  Everything else is mmdet's config.
_base_ = 'mmdet::deformable_detr/deformable-detr_r50_16xb2-50e_coco.py'
custom_imports = dict(imports=['msda_mm'], allow_failed_imports=False)

model = dict(
    # Random backbone weights (no download at run time); for ImageNet
    # weights put back init_cfg=dict(type='Pretrained',
    # checkpoint='torchvision://resnet50').
    backbone=dict(init_cfg=None),
    encoder=dict(layer_cfg=dict(self_attn_cfg=dict(type='TritonMSDeformAttn'))),
    decoder=dict(layer_cfg=dict(cross_attn_cfg=dict(type='TritonMSDeformAttn'))))
# Checkpoints saved atomically with a sha256 beside each, checked before
# loading; --resume falls back to the newest whole one (msda_mm.engine).
default_hooks = dict(checkpoint=dict(type='VerifiedCheckpointHook'))
