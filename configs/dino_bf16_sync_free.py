# dino_bf16_fast_host_compiled.py without the waits on the GPU outside the
# head's matching (configs/_recipe.py's sync_free_model): SyncFreeDINO and
# SyncFreeDetDataPreprocessor, fed pinned batches.  Same losses and
# predictions as DINO (tests/plugin/test_sync_free_dino.py).
_base_ = './dino_bf16.py'

model = {{_base_.sync_free_model}}
optim_wrapper = {{_base_.fast_optim_wrapper}}
custom_hooks = [{{_base_.compile_layers_hook}}, {{_base_.stop_loader_workers_hook}}]
train_dataloader = {{_base_.pinned_loader}}
