"""DINO's targets of a PaddedBatch, in static shapes and without a host read.

The same targets as ``matching.matched_targets`` (Hungarian-matched
outputs) and ``denoising_targets`` (denoising queries) give for the real GT
boxes, as (B, Q, ...) tensors, with the counts of positives and negatives
as device tensors: padding GT slots match no query and weigh nothing.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch
from mmengine.structures import InstanceData
from torch import Tensor

from ... import compat  # noqa: F401  (first: on mmcv-lite, mmdet.models imports only after it)

# isort: split
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy, bbox_xyxy_to_cxcywh

from .matching import batch_cost, solve_assignment
from .padded_batch import PaddedBatch

# labels (B, Q) int64, label_weights (B, Q), bbox_targets (B, Q, 4),
# bbox_weights (B, Q, 4), num_total_pos and num_total_neg (0-d float32).
PaddedTargets = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]


def image_blocks(cost: Tensor, num_imgs: int) -> Tensor:
    """The (B, Q, G) diagonal blocks of a (B * Q, B * G) cost of every query
    against every GT slot of the batch: each image's own cost matrix."""
    rows, cols = cost.shape
    return cost.view(num_imgs, rows // num_imgs, num_imgs, cols // num_imgs).diagonal(
        dim1=0, dim2=2).permute(2, 0, 1)


def padded_matched_targets(match_costs: Sequence, num_classes: int, cls_scores: Tensor,
                           bbox_preds: Tensor, batch: PaddedBatch) -> PaddedTargets:
    """``matching.matched_targets`` of one output, cls_scores (B, Q, C) and
    bbox_preds (B, Q, 4) normalised (cx, cy, w, h), against the batch's
    real GT boxes: the match costs of mmdet's HungarianAssigner on every
    (query, slot) pair, solved on the device with the padding slots left
    out (``solve_assignment``'s column count), the targets scattered to
    the matched queries.  Needs Q >= G."""
    num_imgs, num_queries = cls_scores.shape[:2]
    cap = batch.gt_boxes.shape[1]
    if num_queries < cap:
        raise ValueError(f"matching {cap} GT slots needs as many queries; the output has "
                         f"{num_queries}")
    factors = batch.factors
    pred_factors = factors.to(bbox_preds.dtype)
    gt_boxes = batch.gt_boxes.reshape(-1, 4)
    with torch.no_grad():  # HungarianAssigner detaches the cost
        boxes = bbox_cxcywh_to_xyxy(bbox_preds) * pred_factors[:, None]
        cost = batch_cost(
            match_costs, cls_scores.reshape(-1, cls_scores.shape[-1]), boxes.reshape(-1, 4),
            factors.repeat_interleave(num_queries, 0),
            InstanceData(bboxes=gt_boxes, labels=batch.gt_labels.reshape(-1)),
            factors.repeat_interleave(cap, 0))
        rows = solve_assignment(image_blocks(cost, num_imgs), batch.num_gts)
    # Each real slot's query over the batch; padding goes to a spare row B * Q.
    spare = num_imgs * num_queries
    images = torch.arange(num_imgs, device=rows.device)[:, None]
    query = torch.where(rows >= 0, images * num_queries + rows, spare).reshape(-1)
    labels = torch.full((spare + 1,), num_classes, dtype=torch.long, device=rows.device)
    labels.index_copy_(0, query, batch.gt_labels.reshape(-1))
    bbox_weights = gt_boxes.new_zeros(spare + 1, 4).index_fill_(0, query, 1.0)
    # Regressed in the image's normalised (cx, cy, w, h), as DETRHead does.
    targets = bbox_xyxy_to_cxcywh(batch.gt_boxes / pred_factors[:, None])
    bbox_targets = gt_boxes.new_zeros(spare + 1, 4).index_copy_(
        0, query, targets.reshape(-1, 4).to(gt_boxes.dtype))
    num_pos = batch.num_gts.sum().float()
    return (labels[:spare].view(num_imgs, num_queries),
            gt_boxes.new_ones(num_imgs, num_queries),
            bbox_targets[:spare].view(num_imgs, num_queries, 4),
            bbox_weights[:spare].view(num_imgs, num_queries, 4),
            num_pos, spare - num_pos)


def padded_denoising_targets(num_classes: int, batch: PaddedBatch,
                             num_denoising_queries: int) -> PaddedTargets:
    """``denoising_targets`` of the queries ``SyncFreeCdnQueryGenerator.
    padded_queries`` makes of the batch: slot c * G + j is copy c of GT slot
    j, positive for even c.  As mmdet, every slot below the batch's largest
    count is a background target of weight 1 unless it is a positive; the
    slots past it (which mmdet does not have) weigh 0."""
    num_imgs, cap = batch.gt_labels.shape
    device = batch.gt_labels.device
    slots = torch.arange(num_denoising_queries, device=device)
    box = slots % cap
    positive = ((slots // cap) % 2 == 0) & (box[None] < batch.num_gts[:, None])  # (B, D)
    index = box[None].expand(num_imgs, -1)
    labels = torch.where(positive, batch.gt_labels.gather(1, index), num_classes)
    label_weights = (box < batch.num_gts.max()).float()[None].expand(num_imgs, -1)
    targets = bbox_xyxy_to_cxcywh(batch.gt_boxes / batch.factors[:, None])
    bbox_targets = torch.where(positive[..., None],
                               targets.gather(1, index[..., None].expand(-1, -1, 4)), 0.0)
    bbox_weights = positive[..., None].float().expand(-1, -1, 4)
    num_groups = num_denoising_queries // (2 * cap)
    num_pos = batch.num_gts.sum().float() * num_groups
    return labels, label_weights, bbox_targets, bbox_weights, num_pos, num_pos
