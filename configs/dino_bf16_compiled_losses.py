# dino_bf16_fast_host_compiled.py with the head's losses compiled and
# sync-free (configs/_recipe.py's compiled_losses_head): each output's losses
# one torch.compile graph, forward and backward, that waits for nothing.  The
# losses equal the eager head's within fp32 reordering
# (tests/plugin/test_compiled_losses.py).
_base_ = './dino_bf16.py'

model = dict(bbox_head={{_base_.compiled_losses_head}})
optim_wrapper = {{_base_.fast_optim_wrapper}}
custom_hooks = [{{_base_.compile_layers_hook}}]
