"""Sync-free versions of mmdet's DETR losses (registered in mmdet's MODELS):
the same values and gradients without a host read of a device tensor, so
that they neither wait on CUDA nor break a ``torch.compile`` graph."""
from .focal import SyncFreeFocalLoss
from .giou import SyncFreeGIoULoss
from .l1 import SyncFreeL1Loss
from .overlaps import bbox_overlaps
from .twins import sync_free_twin

__all__ = ["SyncFreeFocalLoss", "SyncFreeGIoULoss", "SyncFreeL1Loss", "bbox_overlaps",
           "sync_free_twin"]
