# dino_bf16_fused_adamw.py with msda_mm's BatchedMatchingDINOHead: the
# Hungarian matching of each decoder output (and of the encoder's proposals)
# computes the costs of the whole batch at once and brings them to the host
# in one transfer: 3 waits on the GPU per output, where mmdet's DINOHead
# waits 5 or more times per image (cost.cpu(), small host-to-device copies,
# nonzero, unique): 7 outputs x 8 images a step at batch 8.  Its denoising
# targets are built for the batch without a wait (mmdet's: 2 per image and
# decoder layer, 96 a step at batch 8).
# Same targets and losses as DINOHead (tests/plugin/test_batched_matching_dino_head.py);
# opt-in because mmdet's configs use its own head.
# MergedGroupsOptimWrapperConstructor: mmdet's paramwise_cfg (backbone
# lr_mult=0.1) gives each parameter a group of its own, which the fused
# AdamW steps one by one (45 ms of host time a step); the same options in a
# few groups (msda_mm/engine/merged_groups_constructor.py).
_base_ = './dino_bf16_fused_adamw.py'

model = dict(bbox_head=dict(type='BatchedMatchingDINOHead'))
optim_wrapper = dict(constructor='MergedGroupsOptimWrapperConstructor')
