# DINO-4scale R50 on the synthetic shapes data with the recipe of
# configs/dino_bf16_fastest.py: bf16 AMP, fused AdamW in merged groups, the
# batched matching head with its losses compiled and sync-free, SyncFreeDINO
# and its preprocessor, pinned batches, the transformer layers compiled.
_base_ = ['./dino_r50_synthetic_bf16.py', './_fastest_recipe.py']

model = {{_base_.fastest_model}}
optim_wrapper = {{_base_.fastest_optim_wrapper}}
train_dataloader = dict(pin_memory=True)
custom_hooks = [dict(type='SyncBuffersHook'), {{_base_.compile_layers_hook}}]
