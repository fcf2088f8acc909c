# The CPU demo's model (dino_tiny_cpu.py) on a GPU in bf16 AMP with
# configs/_recipe.py's fast step, as configs/dino_bf16_fastest.py takes it.
# Its step is all host time (small kernels), which the recipe cuts.
_base_ = './dino_tiny_cpu.py'

model = {{_base_.fastest_model}}
optim_wrapper = {{_base_.fast_optim_wrapper}}
train_dataloader = {{_base_.pinned_loader}}
custom_hooks = [
    dict(type='SyncBuffersHook'),
    dict(type='NumThreadsHook', num_threads=1),
    {{_base_.compile_layers_hook}},
]
