"""mmdet modules built on msda_mm's op; importing registers them in mmdet's MODELS."""
from .batched_matching_dino_head import BatchedMatchingDINOHead
from .triton_ms_deform_attn import TritonMSDeformAttn

__all__ = ["BatchedMatchingDINOHead", "TritonMSDeformAttn"]
