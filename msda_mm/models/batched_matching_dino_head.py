"""DINO's head with the Hungarian matching of a batch behind one device-to-host
transfer per decoder output.

mmdet's ``DETRHead.get_targets`` matches image by image: each image's cost
matrix goes to the host on its own (``HungarianAssigner.assign``'s
``cost.cpu()``), the matched indices come back by pageable (synchronous)
copies and ``nonzero``/``unique`` read them once more, so DINO at batch 8
waits on the device several times per image for each of its 7 matched
outputs (6 decoder layers and the encoder's proposals).  Here the costs of
all images are computed on the device by the config's own match costs,
packed into one tensor and brought over by one ``.cpu()``; scipy matches each
image on the host and the targets of the whole batch are written on the
device from host-built indices, copied without waiting.  The targets are
mmdet's, bit for bit: the cost matrices are the same numbers, so scipy
returns the same matches, ties included.  The denoising targets are not
matched and stay mmdet's.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np
import torch
from mmengine.structures import InstanceData
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from .. import compat  # noqa: F401  (first: on mmcv-lite, mmdet.models imports only after it)

# isort: split
from mmdet.models.dense_heads import DINOHead
from mmdet.models.task_modules.assigners import HungarianAssigner
from mmdet.registry import MODELS
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy, bbox_xyxy_to_cxcywh
from mmdet.utils import InstanceList


def _to_device(host: Tensor, device: torch.device) -> Tensor:
    """``host`` (a CPU tensor) on ``device``.  A copy from pageable memory
    makes CUDA wait for the stream; from pinned memory with
    ``non_blocking=True`` it is queued behind the work already there (the
    caching host allocator keeps the pinned block until the copy is done)."""
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


@MODELS.register_module()
class BatchedMatchingDINOHead(DINOHead):
    """``DINOHead`` whose ``get_targets`` (the Hungarian-matched part: decoder
    layers and encoder proposals) reads the device once per call instead of
    several times per image.  Same arguments, targets and losses as
    ``DINOHead``; ``train_cfg.assigner`` must be a plain ``HungarianAssigner``,
    whose ``match_costs`` are used as configured."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Without train_cfg (a test-time build) DETRHead builds no assigner.
        assigner = getattr(self, "assigner", None)
        # A subclass may assign otherwise: only HungarianAssigner's own
        # assign() is known to be "sum of match_costs, then scipy".
        if assigner is not None and type(assigner) is not HungarianAssigner:
            raise TypeError(f"{type(self).__name__} batches HungarianAssigner's matching; "
                            f"train_cfg.assigner builds {type(assigner).__name__}")

    def _match_cost(self, cls_score: Tensor, bbox_pred: Tensor, factor: Tensor,
                    gt_instances: InstanceData, img_meta: dict) -> Tensor:
        """The cost matrix HungarianAssigner.assign would build for one image,
        the same numbers: cls_score (Q, C) logits, bbox_pred (Q, 4) normalised
        (cx, cy, w, h), factor (4,) = (w, h, w, h) of the image in bbox_pred's
        dtype.  Returns (Q, G), G = len(gt_instances)."""
        # The assigner's input as DETRHead._get_targets_single makes it:
        # boxes in pixels, (x1, y1, x2, y2).
        pred = InstanceData(scores=cls_score, bboxes=bbox_cxcywh_to_xyxy(bbox_pred) * factor)
        costs = [match_cost(pred_instances=pred, gt_instances=gt_instances, img_meta=img_meta)
                 for match_cost in self.assigner.match_costs]
        # Summed as the assigner sums them: the same numbers, to the last bit.
        return torch.stack(costs).sum(dim=0)

    def _match_on_host(self, cls_scores_list: Sequence[Tensor], bbox_preds_list: Sequence[Tensor],
                       factors: Tensor, batch_gt_instances: InstanceList,
                       batch_img_metas: List[dict]) -> List[Tuple[np.ndarray, np.ndarray]]:
        """Per image, scipy's (query indices, GT indices) of the optimal
        matching, both (min(Q_i, G_i),) int64; empty where Q_i or G_i is 0
        (HungarianAssigner leaves those unmatched).  One device-to-host
        transfer for the batch, none if no image needs matching."""
        shapes = [(len(scores), len(gts))
                  for scores, gts in zip(cls_scores_list, batch_gt_instances)]
        to_match = [i for i, (q, g) in enumerate(shapes) if q > 0 and g > 0]
        matches = [(np.zeros(0, np.int64), np.zeros(0, np.int64)) for _ in shapes]
        if not to_match:
            return matches
        with torch.no_grad():  # HungarianAssigner detaches the cost: no graph to build
            packed = torch.cat([
                self._match_cost(cls_scores_list[i], bbox_preds_list[i], factors[i],
                                 batch_gt_instances[i], batch_img_metas[i]).flatten()
                for i in to_match])
            # scipy matches in float64; numpy has no bfloat16, and upcasting a
            # half type to float32 is exact.
            packed = packed.to(torch.promote_types(packed.dtype, torch.float32))
        host = packed.cpu().numpy()  # the one wait on the device
        sizes = [shapes[i][0] * shapes[i][1] for i in to_match]
        for i, flat in zip(to_match, np.split(host, np.cumsum(sizes)[:-1])):
            rows, cols = linear_sum_assignment(flat.reshape(shapes[i]))
            matches[i] = (rows.astype(np.int64), cols.astype(np.int64))
        return matches

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
        bbox_pred = bbox_preds_list[0]
        # (B, 4) = (w, h, w, h) per image, in the predictions' dtype as
        # DETRHead's bbox_pred.new_tensor(...) makes it, sent in one copy.
        factors = torch.tensor([[m["img_shape"][1], m["img_shape"][0]] * 2
                                for m in batch_img_metas], dtype=bbox_pred.dtype)
        factors = _to_device(factors, bbox_pred.device)
        matches = self._match_on_host(cls_scores_list, bbox_preds_list, factors,
                                      batch_gt_instances, batch_img_metas)

        # Targets of the whole batch, (sum Q_i, ...), written at the matches'
        # flat indices and split per image at the end.
        num_queries = [len(scores) for scores in cls_scores_list]
        query_starts = np.cumsum([0] + num_queries[:-1])
        gt_starts = np.cumsum([0] + [len(gts) for gts in batch_gt_instances[:-1]])
        positives = np.concatenate(
            [np.stack([query_starts[i] + rows, gt_starts[i] + cols, np.full_like(rows, i)])
             for i, (rows, cols) in enumerate(matches)], axis=1)  # (3, P): query, GT, image
        num_total_pos = positives.shape[1]

        gt_bboxes = torch.cat([gts.bboxes for gts in batch_gt_instances])
        total = sum(num_queries)
        labels = gt_bboxes.new_full((total,), self.num_classes, dtype=torch.long)
        label_weights = gt_bboxes.new_ones(total)
        bbox_targets = gt_bboxes.new_zeros(total, 4)
        bbox_weights = gt_bboxes.new_zeros(total, 4)
        if num_total_pos:
            query, gt, img = _to_device(torch.from_numpy(positives), gt_bboxes.device)
            gt_labels = torch.cat([gts.labels for gts in batch_gt_instances])
            labels[query] = gt_labels[gt]
            bbox_weights[query] = 1.0
            # Regressed in the image's normalised (cx, cy, w, h), as DETRHead does.
            bbox_targets[query] = bbox_xyxy_to_cxcywh(gt_bboxes[gt] / factors[img])
        return (list(labels.split(num_queries)), list(label_weights.split(num_queries)),
                list(bbox_targets.split(num_queries)), list(bbox_weights.split(num_queries)),
                num_total_pos, total - num_total_pos)
