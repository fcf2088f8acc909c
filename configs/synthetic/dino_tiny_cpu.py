# The CPU demo: a small DINO (half-width R18, fewer transformer layers and
# queries) on small synthetic images, fp32, trained and evaluated end to end
# in a few minutes on one CPU thread, ending with the COCO AP table.  The
# data are written to data/synthetic_tiny/ on first use.  On CPU the MSDA
# modules run msda_mm's PyTorch reference, on a GPU the Triton kernels.
_base_ = './dino_r50_synthetic_fp32.py'

data_root = 'data/synthetic_tiny/'
dataset = dict(data_root=data_root,
               synthetic_cfg=dict(num_train=400, num_val=50, size=(128, 128), seed=0))

# The transformer keeps DINO's 256 channels: mmdet's DINO decoder hard-codes
# the 256-d sine encoding of its reference points.
ffn = dict(feedforward_channels=512)
model = dict(
    num_queries=50,
    backbone=dict(depth=18, base_channels=32),
    neck=dict(in_channels=[64, 128, 256]),
    encoder=dict(num_layers=3, layer_cfg=dict(ffn_cfg=ffn)),
    decoder=dict(num_layers=3, layer_cfg=dict(ffn_cfg=ffn)),
    dn_cfg=dict(group_cfg=dict(num_dn_queries=50)),
    test_cfg=dict(max_per_img=50))

# Two cores: loading in the main process beats forking workers.
loader = dict(num_workers=0, persistent_workers=False, dataset=dataset)
train_dataloader = dict(batch_size=4, **loader)
val_dataloader = loader
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator

# 300 iterations, evaluated at the end.
max_epochs = 3
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[max_epochs],
         gamma=0.1)
]
# A checkpoint every epoch, the last 3 kept: a stopped run loses at most an
# epoch and resumes with tools/train.py --resume (checked before loading).
default_hooks = dict(logger=dict(interval=10), checkpoint=dict(interval=1, max_keep_ckpts=3))
auto_scale_lr = dict(base_batch_size=4)
# A fixed seed and one CPU thread: the AP table is the same from run to run,
# and on machines that differ only in their core count (the thread count sets
# the order of float sums); a busy machine does not stall it either
# (msda_mm/engine/num_threads_hook.py).
randomness = dict(seed=0)
custom_hooks = [dict(type='SyncBuffersHook'), dict(type='NumThreadsHook', num_threads=1)]
