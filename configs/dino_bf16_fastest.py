# The fastest DINO training step msda_mm has: configs/dino_bf16_sync_free.py
# (no waits on the GPU outside the matching: SyncFreeDINO,
# SyncFreeDetDataPreprocessor) with the head's losses compiled and sync-free,
# as configs/dino_bf16_compiled_losses.py has them.
_base_ = './dino_bf16_sync_free.py'

model = dict(
    bbox_head=dict(
        compile_losses=True,
        loss_cls=dict(type='SyncFreeFocalLoss'),
        loss_bbox=dict(type='SyncFreeL1Loss'),
        loss_iou=dict(type='SyncFreeGIoULoss')))
