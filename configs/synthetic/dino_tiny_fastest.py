# The CPU demo's model (dino_tiny_cpu.py) on a GPU with the recipe of
# configs/dino_bf16_fastest.py: bf16 AMP, fused AdamW in merged groups, the
# batched matching head with its losses compiled and sync-free, SyncFreeDINO
# and its preprocessor, pinned batches, the transformer layers compiled.  Its
# step is all host time (a few thousand small kernels), which the recipe cuts.
_base_ = ['./dino_tiny_cpu.py', './_fastest_recipe.py']

model = {{_base_.fastest_model}}
optim_wrapper = {{_base_.fastest_optim_wrapper}}
train_dataloader = dict(pin_memory=True)
custom_hooks = [
    dict(type='SyncBuffersHook'),
    dict(type='NumThreadsHook', num_threads=1),
    {{_base_.compile_layers_hook}},
]
