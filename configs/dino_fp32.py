# DINO-4scale R50 on COCO (data/coco/, mmdet's layout), fp32, with msda_mm's
# Triton op in every multi-scale deformable attention: the fp32 twin of
# dino_bf16.py, for parity runs.  Everything else is mmdet's config.
_base_ = ['mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py', './_recipe.py']
custom_imports = {{_base_.msda_imports}}

model = dict(
    # Nothing is downloaded at run time, so the backbone starts from random
    # weights.  To fine-tune from ImageNet as mmdet's results do, put back
    # init_cfg=dict(type='Pretrained', checkpoint='torchvision://resnet50')
    # (downloads once to ~/.cache/torch, or give a local .pth path).
    backbone=dict(init_cfg=None),
    encoder={{_base_.triton_encoder}},
    decoder={{_base_.triton_decoder}})
default_hooks = dict(checkpoint={{_base_.verified_checkpoint}})
