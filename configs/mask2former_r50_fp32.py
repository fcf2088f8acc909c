# Mask2Former R50 instance segmentation on COCO (data/coco/, mmdet's
# layout), fp32, with msda_mm's Triton op in the pixel decoder's multi-scale
# deformable attention: the fp32 twin of mask2former_r50_bf16.py, for parity
# runs.  Everything else is mmdet's config.
_base_ = 'mmdet::mask2former/mask2former_r50_8xb2-lsj-50e_coco.py'
custom_imports = dict(imports=['msda_mm'], allow_failed_imports=False)

model = dict(
    # Nothing is downloaded at run time (see dino_fp32.py for putting the
    # ImageNet checkpoint back).
    backbone=dict(init_cfg=None),
    panoptic_head=dict(pixel_decoder=dict(encoder=dict(layer_cfg=dict(
        self_attn_cfg=dict(type='TritonMSDeformAttn'))))))
# Checkpoints saved atomically with a sha256 beside each, checked before
# loading; --resume falls back to the newest whole one (msda_mm.engine).
default_hooks = dict(checkpoint=dict(type='VerifiedCheckpointHook'))
