# The pieces msda_mm's configs take in by `{{_base_.NAME}}` (a fragment: a
# config lists it beside the mmdet config it builds on, and every config
# built on that one can take the pieces too).  mmengine refuses a key that two
# bases both set, hence names no mmdet config uses.

# What every msda_mm config sets: msda_mm imported (it registers the op, the
# modules and hooks below), its Triton op in each multi-scale deformable
# attention, and checkpoints saved atomically with a sha256 beside each,
# checked before loading (--resume falls back to the newest whole one).
msda_imports = dict(imports=['msda_mm'], allow_failed_imports=False)
triton_encoder = dict(layer_cfg=dict(self_attn_cfg=dict(type='TritonMSDeformAttn')))
triton_decoder = dict(layer_cfg=dict(cross_attn_cfg=dict(type='TritonMSDeformAttn')))
verified_checkpoint = dict(type='VerifiedCheckpointHook')

# DINO's fast training step, each piece opt-in (mmdet's configs use its own
# modules) and each the same computation as mmdet's (tests/plugin/).
#
# PyTorch's fused AdamW: the whole update in a few multi-tensor kernels
# instead of the default (foreach) AdamW's per-parameter host work.
fused_adamw = dict(fused=True)
# bf16 AMP with the fused AdamW in merged groups: mmdet's paramwise_cfg
# (backbone lr_mult=0.1) gives each parameter a group of its own, which the
# fused AdamW steps one by one; MergedGroupsOptimWrapperConstructor gives
# the same options in a few groups.
fast_optim_wrapper = dict(type='AmpOptimWrapper', dtype='bfloat16', optimizer=fused_adamw,
                          constructor='MergedGroupsOptimWrapperConstructor')
# The Hungarian matching of the whole batch behind one device-to-host
# transfer per decoder output, where mmdet's DINOHead waits on the device
# several times per image; its denoising targets and losses without a wait.
batched_matching_head = dict(type='BatchedMatchingDINOHead')
# That head with its losses as one torch.compile graph per output, forward
# and backward, on the sync-free losses (mmdet's L1Loss and GIoULoss wait on
# the device each call); mmdet's DINO parameters.  The changing number of
# denoising queries does not recompile (dynamic shapes).
compiled_losses_head = dict(
    batched_matching_head,
    compile_losses=True,
    loss_cls=dict(type='SyncFreeFocalLoss'),
    loss_bbox=dict(type='SyncFreeL1Loss'),
    loss_iou=dict(type='SyncFreeGIoULoss'))
# The transformer's layers compiled by torch.compile: the step launches
# thousands of small kernels, most of them in those layers (norms, residual
# adds, FFN, sampling-location arithmetic), which compiling fuses.  The
# first steps compile (minutes).
compile_layers_hook = dict(type='CompileSubmodulesHook',
                           modules=['encoder.layers', 'decoder.layers'])
# No wait on the device outside the matching: SyncFreeDINO reads the levels'
# sizes as ints and builds its denoising queries without a wait per image;
# SyncFreeDetDataPreprocessor sends the batch in one non-blocking copy.
sync_free_model = dict(type='SyncFreeDINO',
                       data_preprocessor=dict(type='SyncFreeDetDataPreprocessor'),
                       bbox_head=batched_matching_head)
# All of it: the sync-free detector with the compiled losses.
fastest_model = dict(sync_free_model, bbox_head=compiled_losses_head)
# The loader pins the images in its own thread; the preprocessor then copies
# them without a wait and without packing their bytes once more.
pinned_loader = dict(pin_memory=True)
# Its workers stopped as the run ends: at exit torch 2.11 waits 5 s for each
# persistent worker of a pinning loader (msda_mm/engine/stop_loader_workers_hook.py).
stop_loader_workers_hook = dict(type='StopLoaderWorkersHook')
# Every training step replayed from CUDA graphs (GraphedDINO, with the
# fastest model's compiled losses, which save GPU time): each batch
# padded to the smallest canvas and GT cap that hold it, the step captured
# at its second batch of a shape and replayed from then on; a batch that
# fits no bucket runs eagerly.  Canvases for DINO's multi-scale resize
# (shorter side <= 800, longer <= 1333, either orientation, mixed in a
# batch), with the sizes it gives a 4:3 image at shorter side 608 and 800: a
# step computes on its whole canvas, and those smaller ones cut its pixels
# by 14% at batch 8 (docs/training.md).
graphed_model = dict(fastest_model, type='GraphedDINO',
                     canvas_sizes=[(608, 811), (800, 1067), (800, 1333), (811, 608),
                                   (1067, 800), (1333, 800), (1088, 1088), (1333, 1333)],
                     gt_caps=[10, 25, 50, 100])
# The synthetic data's: one canvas (the images' generated size), one cap (at
# most 6 shapes an image).
synthetic_graphed_model = dict(graphed_model, canvas_sizes=[(512, 512)], gt_caps=[6])
tiny_graphed_model = dict(graphed_model, canvas_sizes=[(128, 128)], gt_caps=[6])
# Their layers compiled for each shape on its own (static shapes), so that an
# eager step of a key runs the kernels its graph replays and, under
# deterministic algorithms, a graphed run is the eager run bit for bit
# (torch.compile's default recompiles for dynamic shapes at the second key);
# the COCO canvases' keys would pass torch.compile's recompile limit (8).
static_compile_layers_hook = dict(compile_layers_hook, dynamic=False)
# Its model wrapper under a distributed launch (mmengine's
# MMDistributedDataParallel would call the model's loss, eagerly): the step
# stays the model's, the gradients averaged over the ranks between its
# graphs.  On one process mmengine wraps nothing and ignores it.
graphed_data_parallel = dict(type='GraphedDataParallel')
