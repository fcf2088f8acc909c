# The CPU demo's model on a GPU with every training step replayed from CUDA
# graphs, as configs/dino_bf16_graphed.py takes it (dino_tiny_fastest.py's
# step, captured; a config sits at most 3 levels from mmdet's).
_base_ = './dino_tiny_cpu.py'

model = {{_base_.tiny_graphed_model}}
optim_wrapper = {{_base_.fast_optim_wrapper}}
model_wrapper_cfg = {{_base_.graphed_data_parallel}}
train_dataloader = {{_base_.pinned_loader}}
custom_hooks = [
    dict(type='SyncBuffersHook'),
    dict(type='NumThreadsHook', num_threads=1),
    {{_base_.static_compile_layers_hook}},
]
