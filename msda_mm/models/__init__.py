"""mmdet modules built on msda_mm's op; importing registers them in mmdet's MODELS.

``TritonMSDeformAttn`` is the op as mmcv's attention module; ``dino/`` holds
DINO's training step without its waits on the device (opt-in by config)."""
from .dino import (
    BatchedMatchingDINOHead,
    GraphedDINO,
    SyncFreeCdnQueryGenerator,
    SyncFreeDetDataPreprocessor,
    SyncFreeDINO,
    SyncFreeFocalLoss,
    SyncFreeGIoULoss,
    SyncFreeL1Loss,
)
from .triton_ms_deform_attn import TritonMSDeformAttn

__all__ = ["BatchedMatchingDINOHead", "GraphedDINO", "SyncFreeCdnQueryGenerator",
           "SyncFreeDetDataPreprocessor", "SyncFreeDINO", "SyncFreeFocalLoss", "SyncFreeGIoULoss",
           "SyncFreeL1Loss",
           "TritonMSDeformAttn"]
