"""The sync-free loss standing in for a head's configured loss module."""
from __future__ import annotations

from mmdet.models.losses import FocalLoss, GIoULoss, L1Loss
from torch import nn

from .focal import SyncFreeFocalLoss
from .giou import SyncFreeGIoULoss
from .l1 import SyncFreeL1Loss

# mmdet's type (its exact class: a subclass may compute otherwise) -> twin.
_TWINS = {FocalLoss: SyncFreeFocalLoss, L1Loss: SyncFreeL1Loss, GIoULoss: SyncFreeGIoULoss}


def sync_free_twin(name: str, loss: nn.Module, mmdet_type: type) -> nn.Module:
    """``loss`` itself if it is ``mmdet_type``'s sync-free twin, else the twin
    built with its parameters if it is ``mmdet_type``; ValueError naming
    ``name`` (the head's attribute) for any other loss."""
    twin = _TWINS[mmdet_type]
    if type(loss) is twin:
        return loss
    if type(loss) is mmdet_type:
        return twin.of(loss)
    raise ValueError(f"{name} must be {mmdet_type.__name__} or {twin.__name__} to be compiled, "
                     f"got {type(loss).__name__}")
