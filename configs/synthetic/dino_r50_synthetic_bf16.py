# DINO-4scale R50 on the synthetic shapes data in bf16 AMP: one GPU, a few
# minutes, a clearly non-zero COCO AP.  The data are written to
# data/synthetic/ on first use.
_base_ = './dino_r50_synthetic_fp32.py'

optim_wrapper = dict(type='AmpOptimWrapper', dtype='bfloat16')
