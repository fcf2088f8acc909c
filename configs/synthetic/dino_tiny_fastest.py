# The CPU demo's model (dino_tiny_cpu.py) on a GPU with the recipe of
# configs/dino_bf16_fastest.py: bf16 AMP, fused AdamW in merged groups, the
# batched matching head with its losses compiled and sync-free, SyncFreeDINO
# and its preprocessor, pinned batches, the transformer layers compiled.  Its
# step is all host time (a few thousand small kernels), which the recipe cuts.
_base_ = './dino_tiny_cpu.py'

model = dict(
    type='SyncFreeDINO',
    data_preprocessor=dict(type='SyncFreeDetDataPreprocessor'),
    bbox_head=dict(
        type='BatchedMatchingDINOHead',
        compile_losses=True,
        loss_cls=dict(type='SyncFreeFocalLoss'),
        loss_bbox=dict(type='SyncFreeL1Loss'),
        loss_iou=dict(type='SyncFreeGIoULoss')))
optim_wrapper = dict(type='AmpOptimWrapper', dtype='bfloat16', optimizer=dict(fused=True),
                     constructor='MergedGroupsOptimWrapperConstructor')
train_dataloader = dict(pin_memory=True)
custom_hooks = [
    dict(type='SyncBuffersHook'),
    dict(type='NumThreadsHook', num_threads=1),
    dict(type='CompileSubmodulesHook', modules=['encoder.layers', 'decoder.layers']),
]
