# DINO-4scale R50 on COCO with msda_mm's Triton MSDA, trained in bf16 AMP.
# Needs a CUDA GPU: on a machine without one tools/train.py stops and points
# to configs/synthetic/dino_tiny_cpu.py or to the fp32 override
# (--cfg-options optim_wrapper.type=OptimWrapper).
_base_ = './dino_fp32.py'

# bf16 has fp32's exponent range, so mmengine's default dynamic loss scale
# never has to back off; it is kept as a guard against inf/nan steps.
optim_wrapper = dict(type='AmpOptimWrapper', dtype='bfloat16')
