# Mask2Former R50 instance segmentation on COCO (data/coco/, mmdet's
# layout), fp32, with msda_mm's Triton op in the pixel decoder's multi-scale
# deformable attention: the fp32 twin of mask2former_r50_bf16.py, for parity
# runs.  Everything else is mmdet's config.
_base_ = ['mmdet::mask2former/mask2former_r50_8xb2-lsj-50e_coco.py', './_recipe.py']
custom_imports = {{_base_.msda_imports}}

model = dict(
    # Nothing is downloaded at run time (see dino_fp32.py for putting the
    # ImageNet checkpoint back).
    backbone=dict(init_cfg=None),
    panoptic_head=dict(pixel_decoder=dict(encoder={{_base_.triton_encoder}})))
default_hooks = dict(checkpoint={{_base_.verified_checkpoint}})
