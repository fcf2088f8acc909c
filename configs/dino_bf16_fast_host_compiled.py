# dino_bf16_fast_host.py with the transformer's layers compiled by
# torch.compile (configs/_recipe.py's compile_layers_hook), which fuses their
# small kernels.  The first steps compile (minutes).
_base_ = './dino_bf16.py'

model = dict(bbox_head={{_base_.batched_matching_head}})
optim_wrapper = {{_base_.fast_optim_wrapper}}
custom_hooks = [{{_base_.compile_layers_hook}}]
