"""msda_mm: Triton Multi-Scale Deformable Attention for MMDetection 3.x."""
from .ops import multi_scale_deformable_attention, msda_reference

__version__ = "0.1.0"
__all__ = ["multi_scale_deformable_attention", "msda_reference"]
