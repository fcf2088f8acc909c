"""DINO's denoising targets of a batch, built without a wait on the device.

The denoising queries are not matched: each is a noised copy of a GT box,
group by group, so its target is known from the GT counts alone.  mmdet's
``DINOHead.get_dn_targets`` builds them image by image and waits twice per
image and decoder layer (its image-size factor's copy and the scalar it
writes at the positives); here the indices and the image sizes are built on
the host and sent in non-blocking copies, and the targets are mmdet's bit
for bit.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np
import torch

from ... import compat  # noqa: F401  (first: on mmcv-lite, mmdet.models imports only after it)

# isort: split
from mmdet.structures.bbox import bbox_xyxy_to_cxcywh
from mmdet.utils import InstanceList

from .image_sizes import image_factors
from .one_copy import to_device


def denoising_targets(num_classes: int, batch_gt_instances: InstanceList,
                      batch_img_metas: List[dict], dn_meta: Dict[str, int]) -> tuple:
    """``DINOHead.get_dn_targets``, the same tuple, for the whole batch with
    one non-blocking copy of host-built indices and image sizes.

    Each image's D = dn_meta['num_denoising_queries'] denoising queries come
    in num_denoising_groups groups of D / groups; in every group the first G
    (the image's GT count) queries are the positive copies of its GTs, in
    order, and the next half-group the negative ones.

    Returns:
        tuple: labels_list [(D,) long, num_classes but at the positives],
        label_weights_list [(D,) ones], bbox_targets_list [(D, 4) fp32, the
        GT's normalised (cx, cy, w, h) at the positives, else 0],
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
    # (3, P) rows over the batch's B * D queries, GT index over the batch,
    # image; group-major within an image, as mmdet's pos_inds.
    first_gt = np.cumsum([0] + num_gts)
    positives = np.concatenate([np.zeros((3, 0), np.int64)] + [
        np.stack(np.broadcast_arrays(
            i * num_dn + np.arange(num_groups)[:, None] * per_group + np.arange(num),
            first_gt[i] + np.arange(num), i)).reshape(3, -1)
        for i, num in enumerate(num_gts) if num], axis=1).astype(np.int64)
    num_imgs, device = len(batch_gt_instances), gt_bboxes.device
    total = num_imgs * num_dn
    labels = gt_bboxes.new_full((total,), num_classes, dtype=torch.long)
    label_weights = gt_bboxes.new_ones(total)
    # fp32 whatever the GT dtype, as mmdet allocates them.
    bbox_targets = torch.zeros(total, 4, device=device)
    bbox_weights = torch.zeros(total, 4, device=device)
    num_total_pos = positives.shape[1]
    if num_total_pos:
        factors = image_factors(batch_img_metas, gt_bboxes.dtype, device)
        (indices,) = to_device([torch.from_numpy(positives)], device)
        query, gt, img = indices
        labels[query] = gt_labels[gt]
        # index_fill_, not `[query] = 1.0`: a Python scalar would be copied
        # to the device (a wait) first.
        bbox_weights.index_fill_(0, query, 1.0)
        bbox_targets[query] = bbox_xyxy_to_cxcywh(gt_bboxes[gt] / factors[img])
    # One entry per image, also for D = 0 (no GT in the batch), which split() would not give.
    return (list(labels.view(num_imgs, num_dn).unbind()),
            list(label_weights.view(num_imgs, num_dn).unbind()),
            list(bbox_targets.view(num_imgs, num_dn, 4).unbind()),
            list(bbox_weights.view(num_imgs, num_dn, 4).unbind()),
            num_total_pos, num_total_pos)
