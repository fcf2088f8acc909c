# DINO-4scale R50 on the synthetic shapes data with the recipe of
# configs/dino_bf16_fastest.py: bf16 AMP, fused AdamW in merged groups, the
# batched matching head with its losses compiled and sync-free, SyncFreeDINO
# and its preprocessor, pinned batches, the transformer layers compiled.
_base_ = './dino_r50_synthetic_bf16.py'

model = dict(
    type='SyncFreeDINO',
    data_preprocessor=dict(type='SyncFreeDetDataPreprocessor'),
    bbox_head=dict(
        type='BatchedMatchingDINOHead',
        compile_losses=True,
        loss_cls=dict(type='SyncFreeFocalLoss'),
        loss_bbox=dict(type='SyncFreeL1Loss'),
        loss_iou=dict(type='SyncFreeGIoULoss')))
optim_wrapper = dict(optimizer=dict(fused=True), constructor='MergedGroupsOptimWrapperConstructor')
train_dataloader = dict(pin_memory=True)
custom_hooks = [
    dict(type='SyncBuffersHook'),
    dict(type='CompileSubmodulesHook', modules=['encoder.layers', 'decoder.layers']),
]
