# Deformable DETR R50 on COCO with msda_mm's Triton MSDA, trained in bf16
# AMP (needs a CUDA GPU, see dino_bf16.py).
_base_ = './deformable_detr_fp32.py'

optim_wrapper = dict(type='AmpOptimWrapper', dtype='bfloat16')
