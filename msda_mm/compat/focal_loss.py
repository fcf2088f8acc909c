"""mmdet's CUDA focal-loss path without compiled mmcv (mmcv-lite only).

``mmdet.models.losses.FocalLoss`` sends CUDA logits with integer labels (the
DETR heads' case) to ``sigmoid_focal_loss``, which calls mmcv's compiled
``sigmoid_focal_loss`` through the module-level name ``_sigmoid_focal_loss``.
Rebinding that name to the PyTorch computation below keeps mmdet's weight
handling and reduction and only swaps the kernel.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from mmdet.models.losses import focal_loss


def sigmoid_focal_loss_from_labels(pred: torch.Tensor, target: torch.Tensor, gamma: float = 2.0,
                                   alpha: float = 0.25, weight: Optional[torch.Tensor] = None,
                                   reduction: str = "none") -> torch.Tensor:
    """Element-wise sigmoid focal loss with mmcv's ``sigmoid_focal_loss``
    positional arguments, computed by mmdet's ``py_sigmoid_focal_loss``.

    Args:
        pred: (N, C) logits.
        target: (N,) int64 labels in [0, C]; C means background (every class
            is a negative).
        gamma, alpha: focal-loss parameters.
        weight, reduction: only mmdet's call is served: ``None`` and ``'none'``.

    Returns:
        (N, C) loss in pred's dtype.
    """
    if weight is not None or reduction != "none":
        raise ValueError(
            "msda_mm's PyTorch stand-in for mmcv's compiled sigmoid_focal_loss serves mmdet's "
            f"call only (weight=None, reduction='none'); got weight="
            f"{None if weight is None else tuple(weight.shape)}, reduction={reduction!r}")
    if pred.dim() != 2 or target.shape != pred.shape[:1]:
        raise ValueError(f"pred must be (N, C) and target (N,), got pred {tuple(pred.shape)} "
                         f"and target {tuple(target.shape)}")
    num_classes = pred.shape[1]
    one_hot = F.one_hot(target, num_classes + 1)[:, :num_classes]
    return focal_loss.py_sigmoid_focal_loss(pred, one_hot, None, gamma, alpha, reduction="none")


def route_to_pytorch() -> None:
    focal_loss._sigmoid_focal_loss = sigmoid_focal_loss_from_labels
