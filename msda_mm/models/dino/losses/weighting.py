"""What mmdet's box losses decide on the host, decided without reading the
device: the reduction and their early return for weights none of which is
positive."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

_REDUCTIONS = ("none", "mean", "sum")


def check_reduction(name: str, reduction: Optional[str], allow_none: bool = False) -> None:
    if not (reduction in _REDUCTIONS or (allow_none and reduction is None)):
        raise ValueError(f"{name} must be one of {_REDUCTIONS}"
                         f"{' or None' if allow_none else ''}, got {reduction!r}")


def resolve_reduction(reduction: str, reduction_override: Optional[str]) -> str:
    """The module's reduction unless overridden, as mmdet's losses pick it."""
    check_reduction("reduction_override", reduction_override, allow_none=True)
    return reduction_override or reduction


def unless_no_positive_weight(loss: Tensor, pred: Tensor, weight: Optional[Tensor],
                              reduction: str) -> Tensor:
    """``loss``, or where no weight is positive what mmdet's L1Loss and
    GIoULoss return then, ``(pred * weight).sum()``: both are computed and
    ``torch.where`` picks, so the host never reads ``weight`` (mmdet's
    ``torch.any(weight > 0)`` in an ``if`` waits on CUDA, once a call).  The
    value is mmdet's in ``loss``'s dtype, and so is the gradient (``where``
    sends it to the picked side alone).  With reduction 'none' the elementwise
    ``loss`` stays (zero where the weights are): mmdet's scalar there would be
    a shape chosen by the data."""
    if weight is None or reduction == "none":
        return loss
    if pred.dim() == weight.dim() + 1:
        weight = weight.unsqueeze(1)
    return torch.where((weight > 0).any(), loss, (pred * weight).sum().to(loss.dtype))
