# Deformable DETR R50 on COCO (data/coco/), fp32, with msda_mm's Triton op
# in every multi-scale deformable attention: the fp32 twin of
# deformable_detr_bf16.py.  Everything else is mmdet's config.
_base_ = ['mmdet::deformable_detr/deformable-detr_r50_16xb2-50e_coco.py', './_recipe.py']
custom_imports = {{_base_.msda_imports}}

model = dict(
    # Random backbone weights (no download at run time); for ImageNet
    # weights put back init_cfg=dict(type='Pretrained',
    # checkpoint='torchvision://resnet50').
    backbone=dict(init_cfg=None),
    encoder={{_base_.triton_encoder}},
    decoder={{_base_.triton_decoder}})
default_hooks = dict(checkpoint={{_base_.verified_checkpoint}})
