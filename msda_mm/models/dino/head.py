"""DINO's head with the Hungarian matching of a batch behind one
device-to-host transfer per decoder output, its denoising targets and its
losses without a wait.

The parts are mmdet's computations on the same numbers, batched or moved to
the host: the matching (``matching``), the denoising targets
(``denoising_targets``) and the losses from the targets (``head_losses``),
which ``compile_losses`` runs as one ``torch.compile`` graph per output.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import torch
from torch import Tensor, nn

from ... import compat  # noqa: F401  (first: on mmcv-lite, mmdet.models imports only after it)

# isort: split
from mmdet.models.dense_heads import DINOHead
from mmdet.models.losses import FocalLoss, GIoULoss, L1Loss, QualityFocalLoss
from mmdet.registry import MODELS
from mmdet.utils import InstanceList, reduce_mean

from .denoising_targets import denoising_targets
from .head_losses import (
    all_losses,
    as_ratio,
    box_losses,
    box_normaliser,
    cls_loss,
    focal_loss_dtype,
    normaliser,
)
from .image_sizes import image_factors
from .losses import sync_free_twin
from .matching import check_batchable, matched_targets
from .one_copy import to_device
from .padded_batch import PaddedBatch
from .padded_targets import PaddedTargets, padded_denoising_targets, padded_matched_targets

# Graphs the compiled losses may keep: a few output layouts times the dtypes
# they come in, and sizes 0 and 1 (which dynamic shapes specialise).
LOSS_GRAPHS = 64


@MODELS.register_module()
class BatchedMatchingDINOHead(DINOHead):
    """``DINOHead`` whose ``get_targets`` (the Hungarian-matched part: decoder
    layers and encoder proposals) waits on the device once per call instead
    of several times per image, whose ``get_dn_targets`` does not wait, and
    whose losses wait 4 + B times fewer per output (B images).  Same
    arguments, targets and losses as ``DINOHead``; ``train_cfg.assigner``
    must be a plain ``HungarianAssigner`` whose ``match_costs`` are
    FocalLossCost, ClassificationCost, BBoxL1Cost and IoUCost (DETR's and
    DINO's), used as configured.  With ``QualityFocalLoss`` the losses are
    mmdet's own code; under a process group the normalisers are averaged
    over the processes on the device, as in mmdet (their waits stay).

    Args:
        device_matching: solve each output's matching on the device
            (``matching.match_on_device``, ``msda_mm.ops.linear_assignment``)
            instead of by scipy on the host: no wait at all, the same total
            cost per image (ties may resolve otherwise).
        compile_losses: run each output's losses from its targets (the cat
            of the targets, focal loss, box conversions, L1 and GIoU) as one
            ``torch.compile`` graph of the sync-free losses, built with the
            configured ones' parameters (loss_cls FocalLoss, loss_bbox
            L1Loss, loss_iou GIoULoss or their SyncFree twins; ValueError
            for others).  Compiled at first use with dynamic shapes; the
            values are the eager losses' up to fp32 reordering.
    """

    def __init__(self, *args, compile_losses: bool = False, device_matching: bool = False,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.compile_losses = compile_losses
        self.device_matching = device_matching
        self._compiled = None
        self._sync_free_losses = None
        if compile_losses:
            self.sync_free_losses()
        # Without train_cfg (a test-time build) DETRHead builds no assigner.
        assigner = getattr(self, "assigner", None)
        if assigner is not None:
            check_batchable(assigner, type(self).__name__)

    def sync_free_losses(self) -> Tuple[nn.Module, nn.Module, nn.Module]:
        """The sync-free twins of (loss_cls, loss_bbox, loss_iou), built at
        first use; ValueError for losses that have none."""
        if self._sync_free_losses is None:
            # A tuple, not submodules: the state dict stays DINOHead's.
            self._sync_free_losses = tuple(
                sync_free_twin(name, getattr(self, name), mmdet_type)
                for name, mmdet_type in (("loss_cls", FocalLoss), ("loss_bbox", L1Loss),
                                         ("loss_iou", GIoULoss)))
        return self._sync_free_losses

    def loss(self, hidden_states: Tensor, references: List[Tensor], enc_outputs_class: Tensor,
             enc_outputs_coord: Tensor, batch_data_samples, dn_meta: Dict[str, int]) -> dict:
        """``DINOHead.loss``; ``batch_data_samples`` may also be a
        PaddedBatch, whose losses then come in static shapes without a host
        read (the same loss dict)."""
        if not isinstance(batch_data_samples, PaddedBatch):
            return super().loss(hidden_states, references, enc_outputs_class,
                                enc_outputs_coord, batch_data_samples, dn_meta)
        # DINOHead.loss_by_feat hands both on to the per-output losses below.
        return self.loss_by_feat(*self(hidden_states, references), enc_outputs_class,
                                 enc_outputs_coord, batch_data_samples, batch_data_samples,
                                 dn_meta)

    def get_targets(self, cls_scores_list: List[Tensor], bbox_preds_list: List[Tensor],
                    batch_gt_instances: InstanceList, batch_img_metas: List[dict]) -> tuple:
        """``DETRHead.get_targets`` for one decoder output, the same tuple
        (``matching.matched_targets``)."""
        return matched_targets(self.assigner.match_costs, self.num_classes, cls_scores_list,
                               bbox_preds_list, batch_gt_instances, batch_img_metas,
                               on_device=self.device_matching)

    def get_dn_targets(self, batch_gt_instances: InstanceList, batch_img_metas: List[dict],
                       dn_meta: Dict[str, int]) -> tuple:
        """``DINOHead.get_dn_targets``, the same tuple
        (``denoising_targets.denoising_targets``)."""
        return denoising_targets(self.num_classes, batch_gt_instances, batch_img_metas, dn_meta)

    def loss_by_feat_single(self, cls_scores: Tensor, bbox_preds: Tensor,
                            batch_gt_instances: InstanceList,
                            batch_img_metas: List[dict]) -> Tuple[Tensor, Tensor, Tensor]:
        """``DETRHead.loss_by_feat_single``: the losses of one matched output,
        cls_scores (B, Q, cls_out_channels) and bbox_preds (B, Q, 4)."""
        if isinstance(batch_gt_instances, PaddedBatch):
            return self._padded_losses(cls_scores, bbox_preds, padded_matched_targets(
                self.assigner.match_costs, self.num_classes, cls_scores, bbox_preds,
                batch_gt_instances), batch_gt_instances)
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
        if isinstance(batch_gt_instances, PaddedBatch):
            return self._padded_losses(dn_cls_scores, dn_bbox_preds, padded_denoising_targets(
                self.num_classes, batch_gt_instances, dn_meta["num_denoising_queries"]),
                batch_gt_instances)
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
        normalisers come from the host (``head_losses.normaliser``) and the
        per-image (w, h, w, h) factors in one non-blocking copy instead of
        one blocking copy per image.  With ``compile_losses`` the tensor part
        runs as one compiled graph."""
        (labels_list, label_weights_list, bbox_targets_list, bbox_weights_list,
         num_total_pos, num_total_neg) = targets
        # Weighted as in the official DETR repo.
        cls_avg_factor = num_total_pos * 1.0 + num_total_neg * self.bg_cls_weight
        if self.sync_cls_avg_factor:
            cls_avg_factor = normaliser(cls_avg_factor, cls_scores.dtype, cls_scores.device)
        cls_avg_factor = max(cls_avg_factor, 1)
        if isinstance(cls_avg_factor, Tensor) and cls_avg_factor.device != cls_scores.device:
            (cls_avg_factor,) = to_device([cls_avg_factor], cls_scores.device)
        # The boxes are regressed normalised by the image size; the IoU loss
        # compares them in pixels (factors in the predictions' dtype).
        factors = image_factors(batch_img_metas, bbox_preds.dtype, bbox_preds.device)
        if self.compile_losses:
            cls_dtype = focal_loss_dtype(self._sync_free_losses[0], cls_scores,
                                         label_weights_list[0], cls_avg_factor)
            # One graph per output layout and dtypes (under AMP the outputs'
            # dtypes differ): DINO's pass dynamo's default limit of 8.
            with torch._dynamo.config.patch(recompile_limit=LOSS_GRAPHS):
                return self._compiled_losses()(
                    self._sync_free_losses, cls_scores, bbox_preds, labels_list,
                    label_weights_list, bbox_targets_list, bbox_weights_list, factors,
                    as_ratio(cls_avg_factor),
                    as_ratio(box_normaliser(num_total_pos, cls_dtype, cls_scores.device)))
        loss_cls = cls_loss(self.loss_cls, cls_scores, labels_list, label_weights_list,
                            cls_avg_factor)
        return (loss_cls, *box_losses(
            self.loss_bbox, self.loss_iou, bbox_preds, bbox_targets_list, bbox_weights_list,
            factors, box_normaliser(num_total_pos, loss_cls.dtype, loss_cls.device)))

    def _padded_losses(self, cls_scores: Tensor, bbox_preds: Tensor, targets: PaddedTargets,
                       batch: PaddedBatch) -> Tuple[Tensor, Tensor, Tensor]:
        """``_losses`` of (B, Q, ...) outputs and their padded targets, by the
        sync-free losses (compiled with ``compile_losses``), the normalisers
        kept on the device: mmdet's computation on the same numbers, with no
        host read.  In a distributed run the normalisers' ``reduce_mean``
        all-reduces (1,) tensors; in a captured step, on NCCL, that
        collective is captured and replayed with the backward graph, the
        same number of them at every step of every rank whatever its batch's
        shape, so that the ranks' collectives pair up."""
        labels, label_weights, bbox_targets, bbox_weights, num_pos, num_neg = targets
        losses = self.sync_free_losses()
        # Weighted as in the official DETR repo.
        cls_avg_factor = num_pos * 1.0 + num_neg * self.bg_cls_weight
        if self.sync_cls_avg_factor:
            cls_avg_factor = reduce_mean(cls_avg_factor.to(cls_scores.dtype).reshape(1))
        cls_avg_factor = cls_avg_factor.clamp(min=1)
        # DETRHead's .item() of the count in the loss's dtype, here kept on the device.
        cls_dtype = focal_loss_dtype(losses[0], cls_scores, label_weights, cls_avg_factor)
        box_avg_factor = reduce_mean(num_pos.to(cls_dtype).reshape(1)).clamp(min=1).float()[0]
        compute = self._compiled_losses() if self.compile_losses else all_losses
        with torch._dynamo.config.patch(recompile_limit=LOSS_GRAPHS):
            return compute(losses, cls_scores, bbox_preds, [labels.reshape(-1)],
                           [label_weights.reshape(-1)], [bbox_targets.reshape(-1, 4)],
                           [bbox_weights.reshape(-1, 4)], batch.factors.to(bbox_preds.dtype),
                           cls_avg_factor, box_avg_factor)

    def _compiled_losses(self) -> Callable:
        """``head_losses.all_losses`` compiled at first use: dynamic shapes
        (the number of denoising queries changes with the batch's GT boxes),
        no graph break (fullgraph), one graph per output layout and dtypes."""
        if self._compiled is None:
            self._compiled = torch.compile(all_losses, dynamic=True, fullgraph=True)
        return self._compiled
