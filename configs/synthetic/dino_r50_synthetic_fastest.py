# DINO-4scale R50 on the synthetic shapes data in bf16 AMP with
# configs/_recipe.py's fast step, as configs/dino_bf16_fastest.py takes it.
_base_ = './dino_r50_synthetic_bf16.py'

model = {{_base_.fastest_model}}
optim_wrapper = {{_base_.fast_optim_wrapper}}
train_dataloader = {{_base_.pinned_loader}}
custom_hooks = [dict(type='SyncBuffersHook'), {{_base_.compile_layers_hook}},
                {{_base_.stop_loader_workers_hook}}]
