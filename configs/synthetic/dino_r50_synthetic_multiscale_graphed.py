# configs/dino_bf16_graphed.py's model, step and buckets (every training step
# replayed from CUDA graphs) on synthetic shapes of a COCO-like size, through
# DINO's own multi-scale training pipeline: a real run with data loading and
# several shape keys, nothing to download.  The model stays COCO's (80
# classes; the data use 6 of them), so a step costs what a COCO step does.
# The data are written to data/synthetic_480x640/ on first use.
_base_ = '../dino_bf16.py'
# msda_mm.datasets registers SyntheticShapesDataset.
custom_imports = dict(imports=['msda_mm', 'msda_mm.datasets'], allow_failed_imports=False)

model = {{_base_.graphed_model}}
optim_wrapper = {{_base_.fast_optim_wrapper}}
model_wrapper_cfg = {{_base_.graphed_data_parallel}}
custom_hooks = [{{_base_.compile_layers_hook}}, {{_base_.stop_loader_workers_hook}}]

data_root = 'data/synthetic_480x640/'
dataset = dict(
    type='SyntheticShapesDataset',
    data_root=data_root,
    synthetic_cfg=dict(num_train=1000, num_val=100, size=(480, 640), seed=0))
# Batch 8; the multi-scale pipeline takes several of the host's cores.
train_dataloader = dict(
    batch_size=8,
    num_workers=8,
    pin_memory=True,
    dataset=dict(**dataset, ann_file='annotations/instances_train.json',
                 data_prefix=dict(img='train/')))
val_dataloader = dict(
    dataset=dict(**dataset, ann_file='annotations/instances_val.json',
                 data_prefix=dict(img='val/')))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
