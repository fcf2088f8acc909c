"""mmdet's sigmoid FocalLoss computed in PyTorch on every device."""
from __future__ import annotations

from typing import Optional

import torch.nn.functional as F
from mmdet.models.losses import FocalLoss
from mmdet.models.losses.focal_loss import py_focal_loss_with_prob, py_sigmoid_focal_loss
from mmdet.registry import MODELS
from torch import Tensor

from .weighting import check_reduction, resolve_reduction


@MODELS.register_module()
class SyncFreeFocalLoss(FocalLoss):
    """``FocalLoss`` (same arguments) computing what mmdet computes on the
    CPU, on every device: integer labels one-hot encoded (``F.one_hot``
    checks them on the CPU, by device assert on CUDA, without a wait), then
    ``py_sigmoid_focal_loss``.  On CUDA mmdet calls mmcv's compiled kernel
    instead, a custom autograd Function that ``torch.compile`` cannot trace
    (on mmcv-lite msda_mm routes it to this same PyTorch computation)."""

    def __init__(self, use_sigmoid: bool = True, gamma: float = 2.0, alpha: float = 0.25,
                 reduction: str = "mean", loss_weight: float = 1.0,
                 activated: bool = False) -> None:
        if use_sigmoid is not True:
            raise ValueError(f"use_sigmoid must be True (the sigmoid focal loss), got "
                             f"{use_sigmoid!r}")
        check_reduction("reduction", reduction)
        super().__init__(use_sigmoid=True, gamma=gamma, alpha=alpha, reduction=reduction,
                         loss_weight=loss_weight, activated=activated)

    @classmethod
    def of(cls, loss: FocalLoss) -> "SyncFreeFocalLoss":
        """The sync-free twin of mmdet's ``loss``, with its parameters."""
        return cls(use_sigmoid=loss.use_sigmoid, gamma=loss.gamma, alpha=loss.alpha,
                   reduction=loss.reduction, loss_weight=loss.loss_weight,
                   activated=loss.activated)

    def forward(self, pred: Tensor, target: Tensor, weight: Optional[Tensor] = None,
                avg_factor: Optional[float] = None,
                reduction_override: Optional[str] = None) -> Tensor:
        reduction = resolve_reduction(self.reduction, reduction_override)
        if self.activated:  # probabilities: mmdet's function takes labels or one-hot
            loss_fn = py_focal_loss_with_prob
        else:
            if pred.dim() != target.dim():  # labels in [0, C], C the background
                num_classes = pred.size(1)
                target = F.one_hot(target, num_classes=num_classes + 1)[:, :num_classes]
            loss_fn = py_sigmoid_focal_loss
        return self.loss_weight * loss_fn(pred, target, weight, gamma=self.gamma,
                                          alpha=self.alpha, reduction=reduction,
                                          avg_factor=avg_factor)
