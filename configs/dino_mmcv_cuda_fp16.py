# dino_mmcv_cuda_fp32.py in fp16 AMP (mmcv has no bf16 MSDA kernels; its
# Function runs the op in value's dtype, casting locations and weights to it).
_base_ = './dino_mmcv_cuda_fp32.py'

optim_wrapper = dict(type='AmpOptimWrapper', dtype='float16', loss_scale='dynamic')
