# dino_bf16.py with PyTorch's fused AdamW (configs/_recipe.py's fused_adamw):
# the same update rule in a few multi-tensor kernels.
_base_ = './dino_bf16.py'

optim_wrapper = dict(optimizer={{_base_.fused_adamw}})
