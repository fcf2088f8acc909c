# DINO-4scale R50 on the synthetic shapes data (written to data/synthetic/ on
# first use; see msda_mm/datasets/synthetic), fp32: the twin of
# dino_r50_synthetic_bf16.py.  msda_mm's op as in configs/dino_fp32.py, on
# mmdet's config directly: the configs built on this one stay within 3 levels
# of mmdet's.
_base_ = ['mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py', '../_recipe.py']
# msda_mm.datasets registers SyntheticShapesDataset.
custom_imports = dict(imports=['msda_mm', 'msda_mm.datasets'], allow_failed_imports=False)

data_root = 'data/synthetic/'
# Train and val read one generated tree, so they share its arguments.
dataset = dict(
    type='SyntheticShapesDataset',
    data_root=data_root,
    synthetic_cfg=dict(num_train=1000, num_val=100, size=(512, 512), seed=0))

model = dict(
    num_queries=100,  # at most 6 shapes an image: COCO's 900 only cost time
    # Trained from scratch (no download), so nothing is frozen and BN learns
    # its statistics.
    backbone=dict(init_cfg=None, frozen_stages=-1,
                  norm_cfg=dict(type='BN', requires_grad=True), norm_eval=False),
    encoder={{_base_.triton_encoder}},
    decoder={{_base_.triton_decoder}},
    bbox_head=dict(num_classes=6),
    test_cfg=dict(max_per_img=100))

# Images are used at their generated size (shape sizes already vary): one
# input shape, so nothing is recompiled or re-tuned per batch.
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    # A no-op resize that records the scale factor prediction rescaling reads.
    dict(type='Resize', scale_factor=1.0),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=8,
    num_workers=4,
    dataset=dict(**dataset, ann_file='annotations/instances_train.json',
                 data_prefix=dict(img='train/'), pipeline=train_pipeline))
val_dataloader = dict(
    dataset=dict(**dataset, ann_file='annotations/instances_val.json',
                 data_prefix=dict(img='val/'), pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator

# From scratch the backbone learns at the full rate: no paramwise_cfg (COCO's
# backbone lr_mult=0.1 is for fine-tuning ImageNet weights).
optim_wrapper = dict(optimizer=dict(lr=2e-4), paramwise_cfg=dict(_delete_=True))
# 750 iterations, evaluated halfway and at the end.
max_epochs = 6
train_cfg = dict(max_epochs=max_epochs, val_interval=3)
# A linear LR warmup over the first 200 steps beside the MultiStepLR (mmengine
# chains the two): from random weights without it, DINO's loss often stalled
# on a plateau in either precision (docs/training.md).
param_scheduler = [
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[5],
         gamma=0.1),
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=200)
]
default_hooks = dict(checkpoint=dict(type={{_base_.verified_checkpoint.type}}, interval=3,
                                     max_keep_ckpts=2))
# BN learns its statistics here (above), and under DDP each rank keeps its
# own: average them over the ranks after each epoch, before validation and
# checkpoint (a no-op on one GPU), or a multi-GPU run's in-training
# validation scores each rank's share of the images with that rank's
# statistics.
custom_hooks = [dict(type='SyncBuffersHook')]
# A fixed seed: runs this short from scratch are at the very start of
# learning, where seed-to-seed differences swamp any precision effect
# (benchmarks/e2e/README.md), so bf16 and fp32 start from the same weights.
randomness = dict(seed=0)
auto_scale_lr = dict(base_batch_size=8)
