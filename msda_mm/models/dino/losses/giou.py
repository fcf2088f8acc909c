"""mmdet's GIoULoss without a wait on the device."""
from __future__ import annotations

from typing import Optional

import torch
from mmdet.models.losses import GIoULoss
from mmdet.models.losses.utils import weighted_loss
from mmdet.registry import MODELS
from torch import Tensor

from .overlaps import bbox_overlaps
from .weighting import check_reduction, resolve_reduction, unless_no_positive_weight


@weighted_loss
def giou_loss(pred: Tensor, target: Tensor, eps: float = 1e-7) -> Tensor:
    """mmdet's ``giou_loss`` (1 - GIoU of aligned (n, 4) xyxy boxes; fp16
    predictions compared in fp32 against overflow) on the sync-free
    ``bbox_overlaps``."""
    half = pred.dtype == torch.float16
    gious = bbox_overlaps(pred.float() if half else pred, target, mode="giou", is_aligned=True,
                          eps=eps)
    return 1 - (gious.half() if half else gious)


@MODELS.register_module()
class SyncFreeGIoULoss(GIoULoss):
    """``GIoULoss`` (same arguments, values and gradients) that waits for
    nothing: its early return for all-zero weights is picked on the device
    (``unless_no_positive_weight``) and its overlaps clamp by a Python
    epsilon (``bbox_overlaps``); a call traces into one graph."""

    def __init__(self, eps: float = 1e-6, reduction: str = "mean",
                 loss_weight: float = 1.0) -> None:
        check_reduction("reduction", reduction)
        super().__init__(eps=eps, reduction=reduction, loss_weight=loss_weight)

    @classmethod
    def of(cls, loss: GIoULoss) -> "SyncFreeGIoULoss":
        """The sync-free twin of mmdet's ``loss``, with its parameters."""
        return cls(eps=loss.eps, reduction=loss.reduction, loss_weight=loss.loss_weight)

    def forward(self, pred: Tensor, target: Tensor, weight: Optional[Tensor] = None,
                avg_factor: Optional[float] = None,
                reduction_override: Optional[str] = None) -> Tensor:
        reduction = resolve_reduction(self.reduction, reduction_override)
        box_weight = weight
        if weight is not None and weight.dim() > 1:
            # mmdet averages (n, 4) box weights to the loss's (n,).
            if weight.shape != pred.shape:
                raise ValueError(f"weight must be (n,) or pred's shape {tuple(pred.shape)}, "
                                 f"got {tuple(weight.shape)}")
            box_weight = weight.mean(-1)
        loss = self.loss_weight * giou_loss(pred, target, box_weight, eps=self.eps,
                                            reduction=reduction, avg_factor=avg_factor)
        return unless_no_positive_weight(loss, pred, weight, reduction)
