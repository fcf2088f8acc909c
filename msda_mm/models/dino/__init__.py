"""DINO's training step without its waits on the device: the same
parameters, outputs and losses as mmdet's DINO, each part opt-in by config
(configs/dino_bf16_fastest.py takes them all).

detector.py (SyncFreeDINO), cdn_query_generator.py (its denoising queries),
data_preprocessor.py (the batch in one copy), head.py
(BatchedMatchingDINOHead) on matching.py (the batch's Hungarian matching),
denoising_targets.py and head_losses.py, losses/ (mmdet's DETR losses,
sync-free), one_copy.py (host tensors to the device without a wait).
graphed_detector.py (GraphedDINO) replays the whole step from CUDA graphs
on padded_batch.py's static shapes and padded_targets.py's targets."""
from .cdn_query_generator import SyncFreeCdnQueryGenerator
from .data_preprocessor import SyncFreeDetDataPreprocessor
from .detector import SyncFreeDINO
from .graphed_detector import GraphedDINO
from .head import BatchedMatchingDINOHead
from .losses import SyncFreeFocalLoss, SyncFreeGIoULoss, SyncFreeL1Loss

__all__ = ["BatchedMatchingDINOHead", "GraphedDINO", "SyncFreeCdnQueryGenerator",
           "SyncFreeDetDataPreprocessor", "SyncFreeDINO", "SyncFreeFocalLoss", "SyncFreeGIoULoss",
           "SyncFreeL1Loss"]
