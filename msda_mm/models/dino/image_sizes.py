"""Each image's size as the (w, h, w, h) factor DETR's boxes are normalised
by, sent to the device without a wait (mmdet copies one per image, each a
blocking copy)."""
from __future__ import annotations

from typing import List

import torch
from torch import Tensor

from .one_copy import to_device


def image_factors(batch_img_metas: List[dict], dtype: torch.dtype,
                  device: torch.device) -> Tensor:
    """(B, 4) = (w, h, w, h) of each image, in ``dtype`` (exact for image
    sizes), sent to ``device`` in one copy that does not wait."""
    host = torch.tensor([[m["img_shape"][1], m["img_shape"][0]] * 2 for m in batch_img_metas],
                        dtype=dtype)
    (factors,) = to_device([host], device)
    return factors
