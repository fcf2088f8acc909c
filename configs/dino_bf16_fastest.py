# The fastest DINO training step msda_mm has: configs/dino_bf16_compiled_losses.py
# (the head's losses compiled and sync-free) with the sync-free detector and
# preprocessor of configs/dino_bf16_sync_free.py (no waits on the GPU outside
# the matching).
_base_ = './dino_bf16_compiled_losses.py'

model = dict(type='SyncFreeDINO', data_preprocessor=dict(type='SyncFreeDetDataPreprocessor'))
# The loader pins the images in its own thread; the preprocessor then copies
# them without a wait and without packing their bytes once more.
train_dataloader = dict(pin_memory=True)
