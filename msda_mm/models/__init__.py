"""mmdet modules built on msda_mm's op; importing registers them in mmdet's MODELS."""
from .batched_matching_dino_head import BatchedMatchingDINOHead
from .losses import SyncFreeFocalLoss, SyncFreeGIoULoss, SyncFreeL1Loss
from .sync_free_cdn_query_generator import SyncFreeCdnQueryGenerator
from .sync_free_det_data_preprocessor import SyncFreeDetDataPreprocessor
from .sync_free_dino import SyncFreeDINO
from .triton_ms_deform_attn import TritonMSDeformAttn

__all__ = ["BatchedMatchingDINOHead", "SyncFreeCdnQueryGenerator", "SyncFreeDetDataPreprocessor",
           "SyncFreeDINO", "SyncFreeFocalLoss", "SyncFreeGIoULoss", "SyncFreeL1Loss",
           "TritonMSDeformAttn"]
