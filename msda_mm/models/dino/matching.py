"""The Hungarian matching of a batch of DETR outputs behind one
device-to-host transfer.

mmdet's ``DETRHead.get_targets`` matches image by image: each image's cost
matrix goes to the host on its own (``HungarianAssigner.assign``'s
``cost.cpu()``), the matched indices come back by pageable (synchronous)
copies and ``nonzero``/``unique`` read them once more, so DINO waits on the
device several times per image for each of its matched outputs (6 decoder
layers and the encoder's proposals); the match costs themselves wait twice
more per image (each copies a small tensor of the image size or an epsilon
to the device).  Here the config's own match costs run once on the whole
batch, as one block matrix (queries of all images x GT boxes of all images)
whose diagonal blocks are the images' cost matrices; those are packed and
brought over by one ``.cpu()``, scipy matches each image on the host, and
the targets of the whole batch are written on the device from host-built
indices, copied without waiting: 1 wait per matched output in all, whatever
the batch size.  The targets are mmdet's, bit for bit: each cost entry is
computed by the same elementwise operations on the same numbers, so scipy
returns the same matches, ties included.
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np
import torch
from mmengine.structures import InstanceData
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from ... import compat  # noqa: F401  (first: on mmcv-lite, mmdet.models imports only after it)

# isort: split
from mmdet.models.task_modules.assigners import HungarianAssigner
from mmdet.models.task_modules.assigners.match_cost import (
    BBoxL1Cost,
    ClassificationCost,
    FocalLossCost,
    IoUCost,
)
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy, bbox_xyxy_to_cxcywh
from mmdet.utils import InstanceList

from ...ops.linear_assignment import linear_assignment, linear_assignment_reference
from ...ops.runtime import interpreter_enabled
from .image_sizes import image_factors
from .losses import bbox_overlaps
from .one_copy import to_device

# Match costs whose entry for a (query, GT) pair is computed from that pair's
# own inputs by elementwise operations (BBoxL1Cost once its inputs are
# normalised per image, see batch_cost), so that one call on the whole batch
# gives every image's entries, the same numbers as a call per image.
BATCHABLE_COSTS = (FocalLossCost, ClassificationCost, IoUCost, BBoxL1Cost)


def check_batchable(assigner, owner: str) -> None:
    """TypeError naming ``owner`` unless ``assigner`` is a plain
    ``HungarianAssigner`` whose match costs are all BATCHABLE_COSTS: a
    subclass may assign otherwise, and only HungarianAssigner's own
    assign() is known to be "sum of match_costs, then scipy"."""
    if type(assigner) is not HungarianAssigner:
        raise TypeError(f"{owner} batches HungarianAssigner's matching; "
                        f"train_cfg.assigner builds {type(assigner).__name__}")
    for cost in assigner.match_costs:
        if type(cost) not in BATCHABLE_COSTS or getattr(cost, "binary_input", False):
            raise TypeError(
                f"{owner} batches the match costs "
                f"{', '.join(c.__name__ for c in BATCHABLE_COSTS)} (boxes and class "
                f"scores); train_cfg.assigner.match_costs has {type(cost).__name__}"
                + (" with binary_input=True" if getattr(cost, "binary_input", False) else ""))


def iou_cost(cost: IoUCost, boxes: Tensor, gt_boxes: Tensor) -> Tensor:
    """``cost(...)`` of (N, 4) boxes against (G, 4) GT boxes (pixels, xyxy):
    IoUCost's computation on the sync-free ``bbox_overlaps`` (the same
    numbers; mmdet's copies its epsilon to the device, a wait)."""
    half = boxes.dtype == torch.float16  # compared in fp32 against overflow, as IoUCost does
    overlaps = bbox_overlaps(boxes.float() if half else boxes, gt_boxes, mode=cost.iou_mode)
    return -(overlaps.half() if half else overlaps) * cost.weight


def l1_distances(rows: Tensor, cols: Tensor) -> Tensor:
    """(N, G) L1 distances between the rows of (N, K) ``rows`` and (G, K)
    ``cols``, as ``torch.cdist(rows, cols, p=1)`` under autocast (at least
    fp32), by broadcasting: CUDA's cdist gives each distance a thread block
    of its own, 0.76 ms for the 7200 x 80 of a batch of 8 (H200)."""
    dtype = torch.promote_types(torch.promote_types(rows.dtype, cols.dtype), torch.float32)
    return (rows.to(dtype)[:, None] - cols.to(dtype)[None]).abs().sum(-1)


def batch_cost(match_costs: Sequence, scores: Tensor, boxes: Tensor, row_factors: Tensor,
               gt_instances: InstanceData, gt_factors: Tensor) -> Tensor:
    """``match_costs`` (BATCHABLE_COSTS), summed as HungarianAssigner sums
    them, for every query of the batch against every GT box of the batch.

    Args:
        scores: (N, C) logits of all images' queries.
        boxes: (N, 4) their boxes in pixels (x1, y1, x2, y2), as DETRHead
            gives them to the assigner.
        row_factors: (N, 4) (w, h, w, h) of each query's image, in the GT
            boxes' dtype.
        gt_instances: ``bboxes`` (G, 4) in pixels and ``labels`` (G,) of all
            images.
        gt_factors: (G, 4) (w, h, w, h) of each GT box's image.

    Returns:
        (N, G); the block of an image's queries and GT boxes is the cost
        matrix HungarianAssigner.assign builds for that image.
    """
    pred = InstanceData(scores=scores, bboxes=boxes)
    costs = []
    for cost in match_costs:
        if type(cost) is BBoxL1Cost:
            # BBoxL1Cost divides by one image's size: here each row and
            # column by its own image's, then takes its L1 distance.
            # BBoxL1Cost's own division by that size would copy (1, 1, 1, 1)
            # to the device, a wait: skipped, as dividing by 1 changes nothing.
            to_format = bbox_xyxy_to_cxcywh if cost.box_format == "xywh" else torch.clone
            costs.append(l1_distances(to_format(boxes) / row_factors,
                                      to_format(gt_instances.bboxes) / gt_factors)
                         * cost.weight)
        elif type(cost) is IoUCost:
            costs.append(iou_cost(cost, boxes, gt_instances.bboxes))
        else:
            costs.append(cost(pred_instances=pred, gt_instances=gt_instances))
    return torch.stack(costs).sum(dim=0)


def batch_block_costs(match_costs: Sequence, cls_scores_list: Sequence[Tensor],
                      bbox_preds_list: Sequence[Tensor], factors: Tensor, pred_factors: Tensor,
                      gt_instances: InstanceData, num_gts: List[int]) -> Tensor:
    """``batch_cost`` of every query of the batch against every GT box, each
    row and column scaled by its own image's (w, h, w, h): factors in the GT
    boxes' dtype, pred_factors in the predictions' (DETRHead scales the
    predicted boxes so).  (sum Q_i, sum G_i)."""
    num_queries = [len(scores) for scores in cls_scores_list]
    row_factors = torch.cat([f.expand(q, 4) for f, q in zip(factors, num_queries)])
    boxes = bbox_cxcywh_to_xyxy(torch.cat(list(bbox_preds_list))) * torch.cat(
        [f.expand(q, 4) for f, q in zip(pred_factors, num_queries)])
    gt_factors = torch.cat([f.expand(g, 4) for f, g in zip(factors, num_gts)])
    return batch_cost(match_costs, torch.cat(list(cls_scores_list)), boxes, row_factors,
                      gt_instances, gt_factors)


def solve_assignment(cost: Tensor, num_cols: Tensor) -> Tensor:
    """``linear_assignment`` of (P, N, G) costs with num_cols (P,) real
    columns each; CPU tensors outside Triton's interpreter go to scipy
    (``linear_assignment_reference``, the same format)."""
    if cost.is_cuda or interpreter_enabled():
        return linear_assignment(cost, num_cols)
    return linear_assignment_reference(cost, num_cols)


def match_on_host(match_costs: Sequence, cls_scores_list: Sequence[Tensor],
                  bbox_preds_list: Sequence[Tensor], factors: Tensor, pred_factors: Tensor,
                  gt_instances: InstanceData, num_gts: List[int]) -> np.ndarray:
    """The optimal matching of every image under ``match_costs``, as (3, P)
    int64 rows (query, GT, image) with query and GT indices over the whole
    batch.  Images with no query or no GT stay unmatched, as
    HungarianAssigner leaves them.  factors: (B, 4) (w, h, w, h) per image in
    the GT boxes' dtype, pred_factors the same in the predictions';
    gt_instances: the GT boxes and labels of all images, num_gts of them per
    image.  One device-to-host transfer for the batch, none if no image
    needs matching."""
    num_queries = [len(scores) for scores in cls_scores_list]
    q0, g0 = np.cumsum([0] + num_queries), np.cumsum([0] + num_gts)
    to_match = [i for i, (q, g) in enumerate(zip(num_queries, num_gts)) if q > 0 and g > 0]
    if not to_match:
        return np.zeros((3, 0), np.int64)
    with torch.no_grad():  # HungarianAssigner detaches the cost: no graph to build
        cost = batch_block_costs(match_costs, cls_scores_list, bbox_preds_list, factors,
                                 pred_factors, gt_instances, num_gts)
        packed = torch.cat([cost[q0[i]:q0[i + 1], g0[i]:g0[i + 1]].flatten()
                            for i in to_match])
        # scipy matches in float64; numpy has no bfloat16, and upcasting a
        # half type to float32 is exact.
        packed = packed.to(torch.promote_types(packed.dtype, torch.float32))
    host = packed.cpu().numpy()  # the one wait on the device
    sizes = [num_queries[i] * num_gts[i] for i in to_match]
    matches = []
    for i, flat in zip(to_match, np.split(host, np.cumsum(sizes)[:-1])):
        rows, cols = linear_sum_assignment(flat.reshape(num_queries[i], num_gts[i]))
        matches.append(np.stack([q0[i] + rows, g0[i] + cols, np.full_like(rows, i)]))
    return np.concatenate(matches, axis=1).astype(np.int64)


def match_on_device(match_costs: Sequence, cls_scores_list: Sequence[Tensor],
                    bbox_preds_list: Sequence[Tensor], factors: Tensor, pred_factors: Tensor,
                    gt_instances: InstanceData, num_gts: List[int]) -> List[Tensor]:
    """``match_on_host``'s matching, solved on the device: the same cost
    blocks, padded to the batch's largest GT count, go to
    ``msda_mm.ops.linear_assignment`` (one program per image) and the rows
    (query, GT, image) come back as device tensors, without a wait.  The
    total cost of each image's matching is scipy's (ties may resolve
    otherwise).  Every image needs as many queries as GT boxes, all images
    the same number of queries (DETR's outputs); the counts are the host's."""
    num_queries = [len(scores) for scores in cls_scores_list]
    device = gt_instances.bboxes.device
    to_match = [i for i, g in enumerate(num_gts) if g > 0 and num_queries[i] > 0]
    if not to_match:
        return list(torch.zeros((3, 0), dtype=torch.long, device=device))
    Q, G = num_queries[0], max(num_gts)
    g0 = np.cumsum([0] + num_gts)
    # Host-built: each padded block's columns (padding repeats a real one),
    # and where each GT's row lands in the solution.
    columns = [[g0[i] + min(j, num_gts[i] - 1) for j in range(G)] for i in to_match]
    slots = [(k * G + j, i * Q, g0[i] + j, i) for k, i in enumerate(to_match)
             for j in range(num_gts[i])]
    flat, row0, gt, img = zip(*slots)
    columns, counts, images, flat, row0, gt, img = to_device(
        [torch.tensor(columns), torch.tensor([num_gts[i] for i in to_match]),
         torch.tensor(to_match), torch.tensor(flat), torch.tensor(row0), torch.tensor(gt),
         torch.tensor(img)], device)
    with torch.no_grad():
        cost = batch_block_costs(match_costs, cls_scores_list, bbox_preds_list, factors,
                                 pred_factors, gt_instances, num_gts)
        blocks = cost.view(len(num_queries), Q, -1).index_select(0, images).gather(
            2, columns[:, None, :].expand(-1, Q, -1))
        rows = solve_assignment(blocks, counts)
    return [rows.view(-1)[flat] + row0, gt, img]


def matched_targets(match_costs: Sequence, num_classes: int, cls_scores_list: List[Tensor],
                    bbox_preds_list: List[Tensor], batch_gt_instances: InstanceList,
                    batch_img_metas: List[dict], on_device: bool = False) -> tuple:
    """``DETRHead.get_targets`` of one decoder output, the same tuple, its
    assigner's ``match_costs`` run on the whole batch; matched by scipy on
    the host, or ``on_device`` (match_on_device: no wait, where every image
    has as many queries as the others and at least as many as GT boxes).

    Args:
        num_classes: the background label.
        cls_scores_list: per image (Q_i, cls_out_channels) logits.
        bbox_preds_list: per image (Q_i, 4) normalised (cx, cy, w, h).
        batch_gt_instances: per image ``bboxes`` (G_i, 4) in pixels
            (x1, y1, x2, y2) and ``labels`` (G_i,).
        batch_img_metas: per image, ``img_shape`` (h, w).

    Returns:
        tuple: labels_list [(Q_i,) long, num_classes for background],
        label_weights_list [(Q_i,) ones], bbox_targets_list [(Q_i, 4)
        normalised (cx, cy, w, h), zero for background],
        bbox_weights_list [(Q_i, 4), 1 for matched queries],
        num_total_pos (int), num_total_neg (int).
    """
    num_imgs = len(cls_scores_list)
    if num_imgs == 0:
        raise ValueError("get_targets needs at least one image")
    if not len(bbox_preds_list) == len(batch_gt_instances) == len(batch_img_metas) == num_imgs:
        raise ValueError(
            f"one entry per image expected: {num_imgs} cls_scores, {len(bbox_preds_list)} "
            f"bbox_preds, {len(batch_gt_instances)} gt_instances, "
            f"{len(batch_img_metas)} img_metas")
    gt_instances = InstanceData(
        bboxes=torch.cat([gts.bboxes for gts in batch_gt_instances]),
        labels=torch.cat([gts.labels for gts in batch_gt_instances]))
    gt_bboxes = gt_instances.bboxes
    # In the GT boxes' dtype (BBoxL1Cost's factor has that dtype), and
    # rounded to the predictions' on the device where DETRHead's is.
    factors = image_factors(batch_img_metas, gt_bboxes.dtype, gt_bboxes.device)
    pred_factors = factors.to(bbox_preds_list[0].dtype)
    num_gts = [len(gts) for gts in batch_gt_instances]
    num_queries = [len(scores) for scores in cls_scores_list]
    if on_device and len(set(num_queries)) == 1 and max(num_gts) <= num_queries[0]:
        indices = match_on_device(match_costs, cls_scores_list, bbox_preds_list, factors,
                                  pred_factors, gt_instances, num_gts)
    else:
        positives = match_on_host(match_costs, cls_scores_list, bbox_preds_list, factors,
                                  pred_factors, gt_instances, num_gts)
        indices = (to_device([torch.from_numpy(positives)], gt_bboxes.device)[0]
                   if positives.size else positives)
    num_total_pos = indices[0].shape[0]

    # Targets of the whole batch, (sum Q_i, ...), written at the matches'
    # indices and split per image at the end.
    total = sum(num_queries)
    labels = gt_bboxes.new_full((total,), num_classes, dtype=torch.long)
    label_weights = gt_bboxes.new_ones(total)
    bbox_targets = gt_bboxes.new_zeros(total, 4)
    bbox_weights = gt_bboxes.new_zeros(total, 4)
    if num_total_pos:
        query, gt, img = indices
        labels[query] = gt_instances.labels[gt]
        # index_fill_, not `[query] = 1.0`: a Python scalar would be
        # copied to the device (a wait) first.
        bbox_weights.index_fill_(0, query, 1.0)
        # Regressed in the image's normalised (cx, cy, w, h), as DETRHead
        # does (its factor in the predictions' dtype).
        bbox_targets[query] = bbox_xyxy_to_cxcywh(gt_bboxes[gt] / pred_factors[img])
    return (list(labels.split(num_queries)), list(label_weights.split(num_queries)),
            list(bbox_targets.split(num_queries)), list(bbox_weights.split(num_queries)),
            num_total_pos, total - num_total_pos)
