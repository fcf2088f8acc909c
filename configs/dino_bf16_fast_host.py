# dino_bf16.py with the host's work cut (configs/_recipe.py): the fused AdamW
# in merged groups and BatchedMatchingDINOHead, the batch's matching behind
# one device-to-host transfer per decoder output.  Same targets and losses as
# mmdet's DINOHead (tests/plugin/test_batched_matching_dino_head.py).
_base_ = './dino_bf16.py'

model = dict(bbox_head={{_base_.batched_matching_head}})
optim_wrapper = {{_base_.fast_optim_wrapper}}
