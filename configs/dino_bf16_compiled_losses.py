# dino_bf16_fast_host_compiled.py with the head's losses compiled: each of the
# 13 outputs' losses (6 decoder layers and the encoder's proposals matched, 6
# denoising) runs as one torch.compile graph, forward and backward, instead of
# many small eager kernels, and the sync-free losses wait for nothing, where
# mmdet's L1Loss and GIoULoss wait 13 times a step each and GIoULoss's
# overlaps 13 more (batch 8; the matching's IoU cost no longer waits with any
# loss: 7 fewer).  Three graphs (encoder proposals, matched and denoising
# decoder outputs: their views differ in layout) compile in the first step;
# the changing number of denoising queries does not recompile (dynamic shapes).
# The same parameters as mmdet's DINO (loss weights 1, 5, 2; focal gamma 2,
# alpha 0.25); the losses equal the eager head's within fp32 reordering
# (tests/plugin/test_compiled_losses.py).
_base_ = './dino_bf16_fast_host_compiled.py'

model = dict(
    bbox_head=dict(
        compile_losses=True,
        loss_cls=dict(type='SyncFreeFocalLoss'),
        loss_bbox=dict(type='SyncFreeL1Loss'),
        loss_iou=dict(type='SyncFreeGIoULoss')))
