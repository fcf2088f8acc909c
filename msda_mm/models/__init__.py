"""mmdet modules built on msda_mm's op; importing registers them in mmdet's MODELS."""
from .batched_matching_dino_head import BatchedMatchingDINOHead
from .losses import SyncFreeFocalLoss, SyncFreeGIoULoss, SyncFreeL1Loss
from .triton_ms_deform_attn import TritonMSDeformAttn

__all__ = ["BatchedMatchingDINOHead", "SyncFreeFocalLoss", "SyncFreeGIoULoss", "SyncFreeL1Loss",
           "TritonMSDeformAttn"]
