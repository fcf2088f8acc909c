"""mmdet's L1Loss without a wait on the device."""
from __future__ import annotations

from typing import Optional

from mmdet.models.losses import L1Loss
from mmdet.models.losses.smooth_l1_loss import l1_loss
from mmdet.registry import MODELS
from torch import Tensor

from .weighting import check_reduction, resolve_reduction, unless_no_positive_weight


@MODELS.register_module()
class SyncFreeL1Loss(L1Loss):
    """``L1Loss`` (same arguments, values and gradients) whose all-zero-weight
    early return is picked on the device (``unless_no_positive_weight``), so
    that a call waits for nothing and traces into one graph."""

    def __init__(self, reduction: str = "mean", loss_weight: float = 1.0) -> None:
        check_reduction("reduction", reduction)
        super().__init__(reduction=reduction, loss_weight=loss_weight)

    @classmethod
    def of(cls, loss: L1Loss) -> "SyncFreeL1Loss":
        """The sync-free twin of mmdet's ``loss``, with its parameters."""
        return cls(reduction=loss.reduction, loss_weight=loss.loss_weight)

    def forward(self, pred: Tensor, target: Tensor, weight: Optional[Tensor] = None,
                avg_factor: Optional[float] = None,
                reduction_override: Optional[str] = None) -> Tensor:
        reduction = resolve_reduction(self.reduction, reduction_override)
        loss = self.loss_weight * l1_loss(pred, target, weight, reduction=reduction,
                                          avg_factor=avg_factor)
        return unless_no_positive_weight(loss, pred, weight, reduction)
