"""msda_mm: Triton Multi-Scale Deformable Attention for MMDetection 3.x."""
import importlib.util

from .ops import msda_reference, multi_scale_deformable_attention

__version__ = "0.4.0"
__all__ = ["multi_scale_deformable_attention", "msda_reference"]

# The operator needs only torch + triton; the mmdet plugin (registration of
# TritonMSDeformAttn, mmcv-lite shims) comes with it wherever mmdet is
# installed, so that `custom_imports=['msda_mm']` is all a config needs.
if importlib.util.find_spec("mmdet") is not None:
    from . import (
        datasets,  # noqa: F401  (registers SyntheticShapesDataset)
        engine,  # noqa: F401  (registers its optim wrapper, constructor and hook)
    )
    from .models import TritonMSDeformAttn  # noqa: F401

    __all__.append("TritonMSDeformAttn")
