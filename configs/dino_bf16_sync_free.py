# dino_bf16_fast_host_compiled.py with the waits on the GPU outside the head's
# matching taken out (154 waits a step at batch 8 on the H200): SyncFreeDINO
# reads the levels' sizes as ints for the encoder's reference points and
# proposals and builds its denoising queries without a wait per image;
# SyncFreeDetDataPreprocessor sends the batch (images, GT boxes, labels) in
# one non-blocking copy.  Same losses and predictions as DINO
# (tests/plugin/test_sync_free_dino.py).
_base_ = './dino_bf16_fast_host_compiled.py'

model = dict(type='SyncFreeDINO', data_preprocessor=dict(type='SyncFreeDetDataPreprocessor'))
# The loader pins the images in its own thread; the preprocessor then copies
# them without a wait and without packing their bytes once more.
train_dataloader = dict(pin_memory=True)
