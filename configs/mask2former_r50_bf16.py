# Mask2Former R50 instance segmentation on COCO with msda_mm's Triton MSDA
# in the pixel decoder, trained in bf16 AMP (needs a CUDA GPU, see
# dino_bf16.py).  For panoptic segmentation take mmdet's
# mask2former_r50_8xb2-lsj-50e_coco-panoptic.py as the base instead: the
# same override applies.
_base_ = './mask2former_r50_fp32.py'

optim_wrapper = dict(type='AmpOptimWrapper', dtype='bfloat16')
