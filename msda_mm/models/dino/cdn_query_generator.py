"""DINO's denoising query generator without a wait per image.

mmdet's ``CdnQueryGenerator`` normalises each image's GT boxes by a factor
copied to the device on its own (``new_tensor``: a blocking copy per image),
and collates the queries by indices counted on the device (a scalar read per
image for ``max`` and ``arange``).  Here the per-box factors and the
collation indices are built on the host, where the GT counts are known, and
sent in one non-blocking copy.  The random draws are mmdet's own calls in
mmdet's order, so that, seeded, the queries are mmdet's bit for bit.  One
wait is left: the label noise's ``nonzero`` (how many labels are redrawn
sets the size of the next random draw), unless the label noise draws a
label for every query (``label_noise_draws="every_query"``).
"""
from __future__ import annotations

from typing import List, Sequence

import torch
from torch import Tensor

from ... import compat  # noqa: F401  (first: on mmcv-lite, mmdet.models imports only after it)

# isort: split
from mmdet.models.layers import CdnQueryGenerator
from mmdet.structures import SampleList

from .one_copy import to_device
from .padded_batch import PaddedBatch


def _host_indices(img_shapes: Sequence[tuple], counts: List[int], num_groups: int,
                  dtype: torch.dtype) -> List[Tensor]:
    """On the host, for T GT boxes of images ``img_shapes`` ((h, w) each,
    ``counts`` boxes each): (T, 4) (w, h, w, h) of each box's image in
    ``dtype``, and the (image, query) indices at which mmdet's
    ``collate_dn_queries`` puts each of the 2 * num_groups * T noised
    queries.  Built as Python lists, which beat CPU ``repeat_interleave``
    (3.1 ms a call)."""
    boxes = [(i, j) for i, count in enumerate(counts) for j in range(count)]
    step = max(counts, default=0)
    factors = [[w, h, w, h] for (h, w), count in zip(img_shapes, counts) for _ in range(count)]
    return [torch.tensor(factors, dtype=dtype).reshape(len(boxes), 4),
            torch.tensor([i for _ in range(2 * num_groups) for i, _ in boxes], dtype=torch.long),
            torch.tensor([g * step + j for g in range(2 * num_groups) for _, j in boxes],
                         dtype=torch.long)]


# How the label noise draws: mmdet's draws (a label for each noised query,
# whose count is read back: one wait), or a label for every query, kept
# where the query is noised (the same distribution, other draws, no wait).
LABEL_NOISE_DRAWS = ("mmdet", "every_query")


class SyncFreeCdnQueryGenerator(CdnQueryGenerator):
    """``CdnQueryGenerator`` that waits on the device once per call (its
    label noise's ``nonzero``) instead of 2 or 3 times per image; the same
    arguments, outputs and random draws.  With ``label_noise_draws=
    "every_query"`` it does not wait at all: the noised labels have mmdet's
    distribution, drawn otherwise."""

    def __init__(self, *args, label_noise_draws: str = "mmdet", **kwargs) -> None:
        if label_noise_draws not in LABEL_NOISE_DRAWS:
            raise ValueError(f"label_noise_draws must be one of {LABEL_NOISE_DRAWS}, "
                             f"got {label_noise_draws!r}")
        super().__init__(*args, **kwargs)
        self.label_noise_draws = label_noise_draws

    def generate_dn_label_query(self, gt_labels: Tensor, num_groups: int) -> Tensor:
        """mmdet's label queries; with "every_query" draws, a random label
        for each of the 2 * num_groups copies of each GT label, kept with
        probability label_noise_scale / 2 (mmdet's chance of a redraw)."""
        if self.label_noise_draws == "mmdet":
            return super().generate_dn_label_query(gt_labels, num_groups)
        return self.every_query_label_noise(gt_labels, num_groups)

    def every_query_label_noise(self, gt_labels: Tensor, num_groups: int) -> Tensor:
        """The "every_query" label queries of ``gt_labels`` (T,): (2 *
        num_groups * T, embed_dims), copy-major as mmdet's."""
        labels = gt_labels.repeat(2 * num_groups, 1).view(-1)
        noised = torch.rand_like(labels.float()) < (self.label_noise_scale * 0.5)
        drawn = torch.randint_like(labels, 0, self.num_classes)
        return self.label_embedding(torch.where(noised, drawn, labels))

    def __call__(self, batch_data_samples: SampleList) -> tuple:
        if isinstance(batch_data_samples, PaddedBatch):
            return self.padded_queries(batch_data_samples)
        gts = [sample.gt_instances for sample in batch_data_samples]
        counts = [len(gt.bboxes) for gt in gts]
        bboxes = torch.cat([gt.bboxes for gt in gts])
        gt_labels = torch.cat([gt.labels for gt in gts])
        max_num_target = max(counts)
        num_groups = self.get_num_groups(max_num_target)
        factors, images, slots = to_device(
            _host_indices([s.img_shape for s in batch_data_samples], counts, num_groups,
                          bboxes.dtype), bboxes.device)

        dn_label_query = self.generate_dn_label_query(gt_labels, num_groups)
        dn_bbox_query = self.generate_dn_bbox_query(bboxes / factors, num_groups)
        num_denoising_queries = max_num_target * 2 * num_groups
        device = dn_label_query.device
        batched_label_query = torch.zeros(len(gts), num_denoising_queries, self.embed_dims,
                                          device=device)
        batched_bbox_query = torch.zeros(len(gts), num_denoising_queries, 4, device=device)
        batched_label_query[images, slots] = dn_label_query
        batched_bbox_query[images, slots] = dn_bbox_query
        attn_mask = self.generate_dn_mask(max_num_target, num_groups, device=device)
        dn_meta = dict(num_denoising_queries=num_denoising_queries,
                       num_denoising_groups=num_groups)
        return batched_label_query, batched_bbox_query, attn_mask, dn_meta

    def padded_queries(self, batch: PaddedBatch) -> tuple:
        """The queries of a batch of GT boxes padded to a cap G, in static
        shapes: groups as mmdet's for G boxes an image, (B, D, ...) queries
        with D = 2 * groups * G, slot c * G + j holding copy c of box j.

        mmdet pads each image's slots to the batch's largest count M with
        zero queries that take part in the self-attention; here slots past
        an image's count are zero too, and those past M are also cut out of
        it (no query sees them; each sees itself, so that no softmax row is
        empty).  So, up to the order of sums, these queries give mmdet's
        outputs with M boxes and the same groups.  The label noise draws
        for every query ("every_query": no wait); with equal counts G in
        every image, the random draws are mmdet's own on the same boxes."""
        num_imgs, cap = batch.gt_labels.shape
        num_groups = self.get_num_groups(cap)
        copies = 2 * num_groups
        boxes = (batch.gt_boxes / batch.factors[:, None]).reshape(-1, 4)
        label_query = self.every_query_label_noise(batch.gt_labels.reshape(-1), num_groups)
        bbox_query = self.generate_dn_bbox_query(boxes, num_groups)
        valid = batch.gt_valid()[:, None, :, None]

        def batched(query: Tensor) -> Tensor:  # (copies * B * G, C) -> (B, copies * G, C)
            query = query.view(copies, num_imgs, cap, -1).transpose(0, 1)
            return torch.where(valid, query, 0).reshape(num_imgs, copies * cap, -1)

        num_denoising_queries = copies * cap
        attn_mask = self.generate_dn_mask(cap, num_groups, device=boxes.device)
        beyond = torch.arange(num_denoising_queries, device=boxes.device) % cap >= (
            batch.num_gts.max())
        attn_mask[:, :num_denoising_queries] |= beyond
        attn_mask.fill_diagonal_(False)
        dn_meta = dict(num_denoising_queries=num_denoising_queries,
                       num_denoising_groups=num_groups)
        return batched(label_query), batched(bbox_query), attn_mask, dn_meta
