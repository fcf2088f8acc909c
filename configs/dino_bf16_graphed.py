# DINO-4scale R50 on COCO in bf16 AMP with every training step replayed from
# CUDA graphs (configs/_recipe.py's graphed_model): dino_bf16_fastest.py's
# step (fused AdamW, compiled layers and losses), captured.
_base_ = './dino_bf16.py'

model = {{_base_.graphed_model}}
optim_wrapper = {{_base_.fast_optim_wrapper}}
model_wrapper_cfg = {{_base_.graphed_data_parallel}}
custom_hooks = [{{_base_.compile_layers_hook}}, {{_base_.stop_loader_workers_hook}}]
train_dataloader = {{_base_.pinned_loader}}
