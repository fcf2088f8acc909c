"""DINO's head with the Hungarian matching of a batch behind one device-to-host
transfer per decoder output.

mmdet's ``DETRHead.get_targets`` matches image by image: each image's cost
matrix goes to the host on its own (``HungarianAssigner.assign``'s
``cost.cpu()``), the matched indices come back by pageable (synchronous)
copies and ``nonzero``/``unique`` read them once more, so DINO at batch 8
waits on the device several times per image for each of its 7 matched
outputs (6 decoder layers and the encoder's proposals); the match costs
themselves wait twice more per image (each copies a small tensor of the image
size or an epsilon to the device).  Here the config's own match costs run
once on the whole batch, as one block matrix (queries of all images x GT
boxes of all images) whose diagonal blocks are the images' cost matrices;
those are packed and brought over by one ``.cpu()``, scipy matches each image
on the host, and the targets of the whole batch are written on the device
from host-built indices, copied without waiting: 1 wait per matched output
in all, whatever the batch size.  The targets are mmdet's, bit for bit: each
cost entry is computed by the same elementwise operations on the same
numbers, so scipy returns the same matches, ties included.  The denoising
targets (not matched: each GT's noised copies, group by group) are built
for the whole batch at once too, without a wait (mmdet's wait twice per
image and decoder layer: 96 a step for DINO at batch 8, measured on the
H200; without them 406 -> 310 waits a step, docs/training.md), and are mmdet's bit for
bit as well.  The losses of both parts are mmdet's computation on the same
numbers, with the loss normalisers built on the host and the per-image
size factors in one non-blocking copy: 4 + B waits fewer per output (B
images), where mmdet waits once per image for its factor (104 a step at
batch 8, the largest frames left after the matching's cut) and twice for
each of the two normalisers.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist
from mmengine.structures import InstanceData
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

from .. import compat  # noqa: F401  (first: on mmcv-lite, mmdet.models imports only after it)

# isort: split
from mmdet.models.dense_heads import DINOHead
from mmdet.models.losses import FocalLoss, GIoULoss, L1Loss, QualityFocalLoss
from mmdet.models.task_modules.assigners import HungarianAssigner
from mmdet.models.task_modules.assigners.match_cost import (
    BBoxL1Cost,
    ClassificationCost,
    FocalLossCost,
    IoUCost,
)
from mmdet.registry import MODELS
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy, bbox_xyxy_to_cxcywh
from mmdet.utils import InstanceList, reduce_mean

from .losses import bbox_overlaps, sync_free_twin
from .one_copy import to_device

# Match costs whose entry for a (query, GT) pair is computed from that pair's
# own inputs by elementwise operations (BBoxL1Cost once its inputs are
# normalised per image, see _batch_cost), so that one call on the whole batch
# gives every image's entries, the same numbers as a call per image.
_BATCHABLE_COSTS = (FocalLossCost, ClassificationCost, IoUCost, BBoxL1Cost)


def _normaliser(value: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``reduce_mean`` of ``value`` as a (1,) tensor in ``dtype``, as DETRHead
    normalises its losses.  Where there is nothing to reduce (no process
    group), the tensor is built on the host: reading it or comparing it with
    a number then does not wait for the device (mmdet's device tensor waits
    twice: its copy from pageable memory and the read)."""
    distributed = dist.is_available() and dist.is_initialized()
    return reduce_mean(torch.tensor([value], dtype=dtype,
                                    device=device if distributed else "cpu"))


def _image_factors(batch_img_metas: List[dict], dtype: torch.dtype,
                   device: torch.device) -> Tensor:
    """(B, 4) = (w, h, w, h) of each image, in ``dtype`` (exact for image
    sizes), sent to ``device`` in one copy that does not wait."""
    host = torch.tensor([[m["img_shape"][1], m["img_shape"][0]] * 2 for m in batch_img_metas],
                        dtype=dtype)
    (factors,) = to_device([host], device)
    return factors


def _iou_cost(cost: IoUCost, boxes: Tensor, gt_boxes: Tensor) -> Tensor:
    """``cost(...)`` of (N, 4) boxes against (G, 4) GT boxes (pixels, xyxy):
    IoUCost's computation on the sync-free ``bbox_overlaps`` (the same
    numbers; mmdet's copies its epsilon to the device, a wait)."""
    half = boxes.dtype == torch.float16  # compared in fp32 against overflow, as IoUCost does
    overlaps = bbox_overlaps(boxes.float() if half else boxes, gt_boxes, mode=cost.iou_mode)
    return -(overlaps.half() if half else overlaps) * cost.weight


def _num_total_pos(num_total_pos: int, dtype: torch.dtype, device: torch.device) -> float:
    """The mean GT count over the processes in the classification loss's
    ``dtype``, at least 1, as DETRHead normalises the box losses."""
    return torch.clamp(_normaliser(num_total_pos, dtype, device), min=1).item()


def _focal_loss_dtype(loss_cls: nn.Module, cls_scores: Tensor, label_weights: Tensor,
                      cls_avg_factor) -> torch.dtype:
    """The dtype of ``_cls_loss`` with the focal loss ``loss_cls``, known
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


def _cls_loss(loss_cls: nn.Module, cls_scores: Tensor, labels_list: List[Tensor],
              label_weights_list: List[Tensor], cls_avg_factor) -> Tensor:
    """DETRHead's classification loss of (B, Q, C) scores."""
    cls_scores = cls_scores.reshape(-1, cls_scores.shape[-1])
    if len(cls_scores) == 0:  # no denoising query (no GT in the batch)
        return torch.zeros(1, dtype=cls_scores.dtype, device=cls_scores.device)
    return loss_cls(cls_scores, torch.cat(labels_list, 0), torch.cat(label_weights_list, 0),
                    avg_factor=cls_avg_factor)


def _box_losses(loss_bbox: nn.Module, loss_iou: nn.Module, bbox_preds: Tensor,
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


# Graphs the compiled losses may keep: a few output layouts times the dtypes
# they come in, and sizes 0 and 1 (which dynamic shapes specialise).
_LOSS_GRAPHS = 64


def _as_ratio(value):
    """A float normaliser as integers (p, q), value == p / q exactly (q a
    power of two); tensors as they are.  Dynamo keeps ints symbolic, where
    torch 2.11's specialised a float argument: a graph per GT count, 78
    recompiles in 10 steps of DINO at batch 8 on the H200."""
    return value.as_integer_ratio() if isinstance(value, float) else value


def _from_ratio(value):
    """``_as_ratio``'s float back (the same double) inside the graph."""
    return value[0] / value[1] if isinstance(value, tuple) else value


def _all_losses(losses: Tuple[nn.Module, nn.Module, nn.Module], cls_scores: Tensor,
                bbox_preds: Tensor, labels_list: List[Tensor], label_weights_list: List[Tensor],
                bbox_targets_list: List[Tensor], bbox_weights_list: List[Tensor],
                factors: Tensor, cls_avg_factor, num_total_pos) -> Tuple[Tensor, ...]:
    """(loss_cls, loss_bbox, loss_iou) from the host-built normalisers (a
    tensor, or a float as ``_as_ratio``'s integers), by the sync-free
    ``losses`` (classification, L1, IoU): what compile_losses compiles."""
    loss_cls, loss_bbox, loss_iou = losses
    cls_avg_factor, num_total_pos = _from_ratio(cls_avg_factor), _from_ratio(num_total_pos)
    return (_cls_loss(loss_cls, cls_scores, labels_list, label_weights_list, cls_avg_factor),
            *_box_losses(loss_bbox, loss_iou, bbox_preds, bbox_targets_list, bbox_weights_list,
                         factors, num_total_pos))


@MODELS.register_module()
class BatchedMatchingDINOHead(DINOHead):
    """``DINOHead`` whose ``get_targets`` (the Hungarian-matched part: decoder
    layers and encoder proposals) waits on the device once per call
    instead of 5 or more times per image, whose ``get_dn_targets`` does not
    wait, and whose losses wait 4 + B times fewer per output.  Same
    arguments, targets and losses as ``DINOHead``; ``train_cfg.assigner``
    must be a plain ``HungarianAssigner`` whose ``match_costs`` are
    FocalLossCost, ClassificationCost, BBoxL1Cost and IoUCost (DETR's and
    DINO's), used as configured.  With ``QualityFocalLoss`` the losses are
    mmdet's own code; under a process group the normalisers are averaged
    over the processes on the device, as in mmdet (their waits stay).

    Args:
        compile_losses: run each output's losses from its targets (the cat
            of the targets, focal loss, box conversions, L1 and GIoU) as one
            ``torch.compile`` graph of the sync-free losses, built with the
            configured ones' parameters (loss_cls FocalLoss, loss_bbox
            L1Loss, loss_iou GIoULoss or their SyncFree twins; ValueError
            for others).  Compiled at first use with dynamic shapes; the
            values are the eager losses' up to fp32 reordering.
    """

    def __init__(self, *args, compile_losses: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.compile_losses = compile_losses
        self._compiled = None
        if compile_losses:
            # A tuple, not submodules: the state dict stays DINOHead's.
            self._sync_free_losses = tuple(
                sync_free_twin(name, getattr(self, name), mmdet_type)
                for name, mmdet_type in (("loss_cls", FocalLoss), ("loss_bbox", L1Loss),
                                         ("loss_iou", GIoULoss)))
        # Without train_cfg (a test-time build) DETRHead builds no assigner.
        assigner = getattr(self, "assigner", None)
        # A subclass may assign otherwise: only HungarianAssigner's own
        # assign() is known to be "sum of match_costs, then scipy".
        if assigner is None:
            return
        if type(assigner) is not HungarianAssigner:
            raise TypeError(f"{type(self).__name__} batches HungarianAssigner's matching; "
                            f"train_cfg.assigner builds {type(assigner).__name__}")
        for cost in assigner.match_costs:
            if type(cost) not in _BATCHABLE_COSTS or getattr(cost, "binary_input", False):
                raise TypeError(
                    f"{type(self).__name__} batches the match costs "
                    f"{', '.join(c.__name__ for c in _BATCHABLE_COSTS)} (boxes and class "
                    f"scores); train_cfg.assigner.match_costs has {type(cost).__name__}"
                    + (" with binary_input=True" if getattr(cost, "binary_input", False) else ""))

    def _batch_cost(self, scores: Tensor, boxes: Tensor, row_factors: Tensor,
                    gt_instances: InstanceData, gt_factors: Tensor) -> Tensor:
        """The config's match costs, summed as HungarianAssigner sums them,
        for every query of the batch against every GT box of the batch.

        Args:
            scores: (N, C) logits of all images' queries.
            boxes: (N, 4) their boxes in pixels (x1, y1, x2, y2), as
                DETRHead gives them to the assigner.
            row_factors: (N, 4) (w, h, w, h) of each query's image, in the GT
                boxes' dtype.
            gt_instances: ``bboxes`` (G, 4) in pixels and ``labels`` (G,) of
                all images.
            gt_factors: (G, 4) (w, h, w, h) of each GT box's image.

        Returns:
            (N, G); the block of an image's queries and GT boxes is the cost
            matrix HungarianAssigner.assign builds for that image.
        """
        pred = InstanceData(scores=scores, bboxes=boxes)
        costs = []
        for cost in self.assigner.match_costs:
            if type(cost) is BBoxL1Cost:
                # BBoxL1Cost divides by one image's size: here each row and
                # column by its own image's, then takes its L1 distance.
                # BBoxL1Cost's own division by that size would copy (1, 1, 1, 1)
                # to the device, a wait: skipped, as dividing by 1 changes nothing.
                to_format = bbox_xyxy_to_cxcywh if cost.box_format == "xywh" else torch.clone
                costs.append(torch.cdist(to_format(boxes) / row_factors,
                                         to_format(gt_instances.bboxes) / gt_factors,
                                         p=1) * cost.weight)
            elif type(cost) is IoUCost:
                costs.append(_iou_cost(cost, boxes, gt_instances.bboxes))
            else:
                costs.append(cost(pred_instances=pred, gt_instances=gt_instances))
        return torch.stack(costs).sum(dim=0)

    def _match_on_host(self, cls_scores_list: Sequence[Tensor], bbox_preds_list: Sequence[Tensor],
                       factors: Tensor, pred_factors: Tensor, gt_instances: InstanceData,
                       num_gts: List[int]) -> np.ndarray:
        """The optimal matching of every image, as (3, P) int64 rows (query,
        GT, image) with query and GT indices over the whole batch.  Images
        with no query or no GT stay unmatched, as HungarianAssigner leaves
        them.  factors: (B, 4) (w, h, w, h) per image in the GT boxes' dtype,
        pred_factors the same in the predictions'; gt_instances: the GT boxes
        and labels of all images, num_gts of them per image.  One
        device-to-host transfer for the batch, none if no image needs
        matching."""
        num_queries = [len(scores) for scores in cls_scores_list]
        q0, g0 = np.cumsum([0] + num_queries), np.cumsum([0] + num_gts)
        to_match = [i for i, (q, g) in enumerate(zip(num_queries, num_gts)) if q > 0 and g > 0]
        if not to_match:
            return np.zeros((3, 0), np.int64)
        with torch.no_grad():  # HungarianAssigner detaches the cost: no graph to build
            row_factors = torch.cat([f.expand(q, 4) for f, q in zip(factors, num_queries)])
            # DETRHead scales by the image size in the predictions' dtype.
            boxes = bbox_cxcywh_to_xyxy(torch.cat(list(bbox_preds_list))) * torch.cat(
                [f.expand(q, 4) for f, q in zip(pred_factors, num_queries)])
            gt_factors = torch.cat([f.expand(g, 4) for f, g in zip(factors, num_gts)])
            cost = self._batch_cost(torch.cat(list(cls_scores_list)), boxes, row_factors,
                                    gt_instances, gt_factors)
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

    def loss_by_feat_single(self, cls_scores: Tensor, bbox_preds: Tensor,
                            batch_gt_instances: InstanceList,
                            batch_img_metas: List[dict]) -> Tuple[Tensor, Tensor, Tensor]:
        """``DETRHead.loss_by_feat_single``: the losses of one matched output,
        cls_scores (B, Q, cls_out_channels) and bbox_preds (B, Q, 4)."""
        if isinstance(self.loss_cls, QualityFocalLoss):  # its scores need mmdet's own code
            return super().loss_by_feat_single(cls_scores, bbox_preds, batch_gt_instances,
                                               batch_img_metas)
        targets = self.get_targets(list(cls_scores.unbind()), list(bbox_preds.unbind()),
                                   batch_gt_instances, batch_img_metas)
        return self._losses(cls_scores, bbox_preds, targets, batch_img_metas)

    def _loss_dn_single(self, dn_cls_scores: Tensor, dn_bbox_preds: Tensor,
                        batch_gt_instances: InstanceList, batch_img_metas: List[dict],
                        dn_meta: Dict[str, int]) -> Tuple[Tensor, Tensor, Tensor]:
        """``DINOHead._loss_dn_single``: the losses of the denoising queries of
        one output, dn_cls_scores (B, D, cls_out_channels) and dn_bbox_preds
        (B, D, 4)."""
        if isinstance(self.loss_cls, QualityFocalLoss):
            return super()._loss_dn_single(dn_cls_scores, dn_bbox_preds, batch_gt_instances,
                                           batch_img_metas, dn_meta)
        targets = self.get_dn_targets(batch_gt_instances, batch_img_metas, dn_meta)
        return self._losses(dn_cls_scores, dn_bbox_preds, targets, batch_img_metas)

    def _losses(self, cls_scores: Tensor, bbox_preds: Tensor, targets: tuple,
                batch_img_metas: List[dict]) -> Tuple[Tensor, Tensor, Tensor]:
        """(loss_cls, loss_bbox, loss_iou) of (B, Q, ...) outputs and their
        targets (get_targets' or get_dn_targets' tuple), computed as mmdet's
        loss_by_feat_single and _loss_dn_single compute them, on the same
        numbers in the same dtypes, except where they wait on the device: the
        normalisers come from the host (``_normaliser``) and the per-image
        (w, h, w, h) factors in one non-blocking copy instead of one blocking
        copy per image; 2 + 2 + B waits fewer per call (B images).  With
        ``compile_losses`` the tensor part runs as one compiled graph."""
        (labels_list, label_weights_list, bbox_targets_list, bbox_weights_list,
         num_total_pos, num_total_neg) = targets
        # Weighted as in the official DETR repo.
        cls_avg_factor = num_total_pos * 1.0 + num_total_neg * self.bg_cls_weight
        if self.sync_cls_avg_factor:
            cls_avg_factor = _normaliser(cls_avg_factor, cls_scores.dtype, cls_scores.device)
        cls_avg_factor = max(cls_avg_factor, 1)
        if isinstance(cls_avg_factor, Tensor) and cls_avg_factor.device != cls_scores.device:
            (cls_avg_factor,) = to_device([cls_avg_factor], cls_scores.device)
        # The boxes are regressed normalised by the image size; the IoU loss
        # compares them in pixels (factors in the predictions' dtype).
        factors = _image_factors(batch_img_metas, bbox_preds.dtype, bbox_preds.device)
        if self.compile_losses:
            cls_dtype = _focal_loss_dtype(self._sync_free_losses[0], cls_scores,
                                          label_weights_list[0], cls_avg_factor)
            # One graph per output layout and dtypes (under AMP the outputs' dtypes differ):
            # at batch 8 on the H200 they passed dynamo's default limit of 8.
            with torch._dynamo.config.patch(recompile_limit=_LOSS_GRAPHS):
                return self._compiled_losses()(
                    self._sync_free_losses, cls_scores, bbox_preds, labels_list,
                    label_weights_list, bbox_targets_list, bbox_weights_list, factors,
                    _as_ratio(cls_avg_factor),
                    _as_ratio(_num_total_pos(num_total_pos, cls_dtype, cls_scores.device)))
        loss_cls = _cls_loss(self.loss_cls, cls_scores, labels_list, label_weights_list,
                             cls_avg_factor)
        return (loss_cls, *_box_losses(
            self.loss_bbox, self.loss_iou, bbox_preds, bbox_targets_list, bbox_weights_list,
            factors, _num_total_pos(num_total_pos, loss_cls.dtype, loss_cls.device)))

    def _compiled_losses(self) -> Callable:
        """``_all_losses`` compiled at first use: dynamic shapes (the number
        of denoising queries changes with the batch's GT boxes), no graph
        break (fullgraph), one graph per output layout and dtypes."""
        if self._compiled is None:
            self._compiled = torch.compile(_all_losses, dynamic=True, fullgraph=True)
        return self._compiled

    def get_dn_targets(self, batch_gt_instances: InstanceList, batch_img_metas: List[dict],
                       dn_meta: Dict[str, int]) -> tuple:
        """``DINOHead.get_dn_targets``, the same tuple, for the whole batch
        with one non-blocking copy of host-built indices and image sizes.

        Each image's D = dn_meta['num_denoising_queries'] denoising queries
        come in num_denoising_groups groups of D / groups; in every group the
        first G (the image's GT count) queries are the positive copies of its
        GTs, in order, and the next half-group the negative ones.

        Returns:
            tuple: labels_list [(D,) long, num_classes but at the positives],
            label_weights_list [(D,) ones], bbox_targets_list [(D, 4) fp32,
            the GT's normalised (cx, cy, w, h) at the positives, else 0],
            bbox_weights_list [(D, 4) fp32, 1 at the positives],
            num_total_pos (int), num_total_neg (int, as many).
        """
        num_groups = dn_meta["num_denoising_groups"]
        num_dn = dn_meta["num_denoising_queries"]
        per_group = int(num_dn / num_groups)  # as mmdet rounds it
        gt_bboxes = torch.cat([gts.bboxes for gts in batch_gt_instances])
        gt_labels = torch.cat([gts.labels for gts in batch_gt_instances])
        num_gts = [len(gts.labels) for gts in batch_gt_instances]
        if max(num_gts, default=0) > per_group // 2:
            # mmdet would write over the negatives, past the group or fail past the image.
            raise ValueError(f"dn_meta has groups of {per_group} denoising queries, room for "
                             f"{per_group // 2} GT boxes an image; an image has "
                             f"{max(num_gts)}")
        # (3, P) rows over the batch's B * D queries, GT index over the
        # batch, image; group-major within an image, as mmdet's pos_inds.
        first_gt = np.cumsum([0] + num_gts)
        positives = np.concatenate([np.zeros((3, 0), np.int64)] + [
            np.stack(np.broadcast_arrays(
                i * num_dn + np.arange(num_groups)[:, None] * per_group + np.arange(num),
                first_gt[i] + np.arange(num), i)).reshape(3, -1)
            for i, num in enumerate(num_gts) if num], axis=1).astype(np.int64)
        num_imgs, device = len(batch_gt_instances), gt_bboxes.device
        total = num_imgs * num_dn
        labels = gt_bboxes.new_full((total,), self.num_classes, dtype=torch.long)
        label_weights = gt_bboxes.new_ones(total)
        # fp32 whatever the GT dtype, as mmdet allocates them.
        bbox_targets = torch.zeros(total, 4, device=device)
        bbox_weights = torch.zeros(total, 4, device=device)
        num_total_pos = positives.shape[1]
        if num_total_pos:
            factors = _image_factors(batch_img_metas, gt_bboxes.dtype, device)
            (indices,) = to_device([torch.from_numpy(positives)], device)
            query, gt, img = indices
            labels[query] = gt_labels[gt]
            bbox_weights.index_fill_(0, query, 1.0)  # no scalar copy: see get_targets
            bbox_targets[query] = bbox_xyxy_to_cxcywh(gt_bboxes[gt] / factors[img])
        # One entry per image, also for D = 0 (no GT in the batch), which split() would not give.
        return (list(labels.view(num_imgs, num_dn).unbind()),
                list(label_weights.view(num_imgs, num_dn).unbind()),
                list(bbox_targets.view(num_imgs, num_dn, 4).unbind()),
                list(bbox_weights.view(num_imgs, num_dn, 4).unbind()),
                num_total_pos, num_total_pos)

    def get_targets(self, cls_scores_list: List[Tensor], bbox_preds_list: List[Tensor],
                    batch_gt_instances: InstanceList, batch_img_metas: List[dict]) -> tuple:
        """``DETRHead.get_targets`` for one decoder output, the same tuple.

        Args:
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
        factors = _image_factors(batch_img_metas, gt_bboxes.dtype, gt_bboxes.device)
        pred_factors = factors.to(bbox_preds_list[0].dtype)
        positives = self._match_on_host(cls_scores_list, bbox_preds_list, factors, pred_factors,
                                        gt_instances, [len(gts) for gts in batch_gt_instances])
        num_total_pos = positives.shape[1]

        # Targets of the whole batch, (sum Q_i, ...), written at the matches'
        # indices and split per image at the end.
        num_queries = [len(scores) for scores in cls_scores_list]
        total = sum(num_queries)
        labels = gt_bboxes.new_full((total,), self.num_classes, dtype=torch.long)
        label_weights = gt_bboxes.new_ones(total)
        bbox_targets = gt_bboxes.new_zeros(total, 4)
        bbox_weights = gt_bboxes.new_zeros(total, 4)
        if num_total_pos:
            (indices,) = to_device([torch.from_numpy(positives)], gt_bboxes.device)
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
