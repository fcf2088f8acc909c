# The fastest DINO training step msda_mm has: every piece of
# configs/_recipe.py's fast step (dino_bf16_compiled_losses.py's compiled
# losses with dino_bf16_sync_free.py's sync-free detector and preprocessor).
_base_ = './dino_bf16.py'

model = {{_base_.fastest_model}}
optim_wrapper = {{_base_.fast_optim_wrapper}}
custom_hooks = [{{_base_.compile_layers_hook}}, {{_base_.stop_loader_workers_hook}}]
train_dataloader = {{_base_.pinned_loader}}
