"""DETRHead's losses of one output from its targets, without its waits on
the device.

mmdet's ``loss_by_feat_single`` and ``_loss_dn_single`` copy each image's
size factor to the device on its own (a blocking copy per image) and build
the two loss normalisers as device tensors it then reads.  Here the factors
come in one non-blocking copy (``image_factors``) and the normalisers from
the host where there is no process group to average them over; the losses
are mmdet's computation on the same numbers, in the same dtypes.
"""
from __future__ import annotations

from typing import List, Tuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ... import compat  # noqa: F401  (first: on mmcv-lite, mmdet.models imports only after it)

# isort: split
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy
from mmdet.utils import reduce_mean


def normaliser(value: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``reduce_mean`` of ``value`` as a (1,) tensor in ``dtype``, as DETRHead
    normalises its losses.  Where there is nothing to reduce (no process
    group), the tensor is built on the host: reading it or comparing it with
    a number then does not wait for the device (mmdet's device tensor waits
    twice: its copy from pageable memory and the read)."""
    distributed = dist.is_available() and dist.is_initialized()
    return reduce_mean(torch.tensor([value], dtype=dtype,
                                    device=device if distributed else "cpu"))


def box_normaliser(num_total_pos: int, dtype: torch.dtype, device: torch.device) -> float:
    """The mean GT count over the processes in the classification loss's
    ``dtype``, at least 1, as DETRHead normalises the box losses."""
    return torch.clamp(normaliser(num_total_pos, dtype, device), min=1).item()


def focal_loss_dtype(loss_cls: nn.Module, cls_scores: Tensor, label_weights: Tensor,
                     cls_avg_factor) -> torch.dtype:
    """The dtype of ``cls_loss`` with the focal loss ``loss_cls``, known
    before it is computed (the box losses' normaliser takes it): its (N, C)
    terms times the label weights, then, reduced by 'mean', divided by the
    normaliser, whose (1,) tensor (sync_cls_avg_factor) sets the dtype
    against the 0-dim sum (bf16 predictions under AMP: a bf16 loss)."""
    if cls_scores.numel() == 0:
        return cls_scores.dtype
    dtype = torch.promote_types(cls_scores.dtype, label_weights.dtype)
    if loss_cls.reduction != "mean":
        return dtype
    return torch.result_type(torch.empty((), dtype=dtype), cls_avg_factor)


def cls_loss(loss_cls: nn.Module, cls_scores: Tensor, labels_list: List[Tensor],
             label_weights_list: List[Tensor], cls_avg_factor) -> Tensor:
    """DETRHead's classification loss of (B, Q, C) scores."""
    cls_scores = cls_scores.reshape(-1, cls_scores.shape[-1])
    if len(cls_scores) == 0:  # no denoising query (no GT in the batch)
        return torch.zeros(1, dtype=cls_scores.dtype, device=cls_scores.device)
    return loss_cls(cls_scores, torch.cat(labels_list, 0), torch.cat(label_weights_list, 0),
                    avg_factor=cls_avg_factor)


def box_losses(loss_bbox: nn.Module, loss_iou: nn.Module, bbox_preds: Tensor,
               bbox_targets_list: List[Tensor], bbox_weights_list: List[Tensor],
               factors: Tensor, num_total_pos: float) -> Tuple[Tensor, Tensor]:
    """DETRHead's (loss_bbox, loss_iou) of (B, Q, 4) normalised (cx, cy, w,
    h) predictions; factors (B, 4) (w, h, w, h) of each image."""
    num_imgs, num_queries = bbox_preds.shape[:2]
    bbox_targets = torch.cat(bbox_targets_list, 0)
    bbox_weights = torch.cat(bbox_weights_list, 0)
    factors = factors[:, None].expand(num_imgs, num_queries, 4).reshape(-1, 4)
    bbox_preds = bbox_preds.reshape(-1, 4)
    bboxes = bbox_cxcywh_to_xyxy(bbox_preds) * factors
    bboxes_gt = bbox_cxcywh_to_xyxy(bbox_targets) * factors
    loss_iou = loss_iou(bboxes, bboxes_gt, bbox_weights, avg_factor=num_total_pos)
    loss_bbox = loss_bbox(bbox_preds, bbox_targets, bbox_weights, avg_factor=num_total_pos)
    return loss_bbox, loss_iou


def as_ratio(value):
    """A float normaliser as integers (p, q), value == p / q exactly (q a
    power of two); tensors as they are.  Dynamo keeps ints symbolic, where
    torch 2.11's specialised a float argument: a graph per GT count."""
    return value.as_integer_ratio() if isinstance(value, float) else value


def from_ratio(value):
    """``as_ratio``'s float back (the same double) inside the graph."""
    return value[0] / value[1] if isinstance(value, tuple) else value


def all_losses(losses: Tuple[nn.Module, nn.Module, nn.Module], cls_scores: Tensor,
               bbox_preds: Tensor, labels_list: List[Tensor], label_weights_list: List[Tensor],
               bbox_targets_list: List[Tensor], bbox_weights_list: List[Tensor],
               factors: Tensor, cls_avg_factor, num_total_pos) -> Tuple[Tensor, ...]:
    """(loss_cls, loss_bbox, loss_iou) from the host-built normalisers (a
    tensor, or a float as ``as_ratio``'s integers), by the sync-free
    ``losses`` (classification, L1, IoU): what compile_losses compiles."""
    loss_cls, loss_bbox, loss_iou = losses
    cls_avg_factor, num_total_pos = from_ratio(cls_avg_factor), from_ratio(num_total_pos)
    return (cls_loss(loss_cls, cls_scores, labels_list, label_weights_list, cls_avg_factor),
            *box_losses(loss_bbox, loss_iou, bbox_preds, bbox_targets_list, bbox_weights_list,
                        factors, num_total_pos))
