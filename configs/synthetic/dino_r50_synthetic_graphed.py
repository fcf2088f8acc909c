# DINO-4scale R50 on the synthetic shapes data with every training step
# replayed from CUDA graphs, as configs/dino_bf16_graphed.py takes it.
_base_ = './dino_r50_synthetic_bf16.py'

model = {{_base_.synthetic_graphed_model}}
optim_wrapper = {{_base_.fast_optim_wrapper}}
model_wrapper_cfg = {{_base_.graphed_data_parallel}}
train_dataloader = {{_base_.pinned_loader}}
custom_hooks = [dict(type='SyncBuffersHook'), {{_base_.static_compile_layers_hook}},
                {{_base_.stop_loader_workers_hook}}]
