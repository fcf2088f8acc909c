"""A DINO training batch of static shapes: images padded to a canvas, GT
boxes padded to a cap, the real counts and sizes as device tensors.

A CUDA graph replays fixed shapes and reads nothing from the host, so what
mmdet keeps as per-image Python data (``img_shape``, a GT list per image)
becomes tensors here, and every shape comes from the bucket the batch falls
into: (images, canvas height, canvas width, GT cap).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .one_copy import to_device

# (images, canvas height, canvas width, GT boxes per image).
BatchKey = Tuple[int, int, int, int]


@dataclass
class PaddedBatch:
    """One training batch of DINO in static shapes.

    Attributes:
        images: (B, 3, H, W) the normalised images, zero outside each image.
        image_sizes: (B, 2) int64 (h, w) of each image inside the canvas.
        factors: (B, 4) float32 (w, h, w, h) of each image.
        gt_boxes: (B, G, 4) float32 GT boxes in pixels (x1, y1, x2, y2);
            (0, 0, 1, 1) past an image's count (any box of positive size
            keeps the match costs and losses finite; its weight is 0).
        gt_labels: (B, G) int64, 0 past an image's count.
        num_gts: (B,) int64 GT boxes of each image, at most G.
    """

    images: Tensor
    image_sizes: Tensor
    factors: Tensor
    gt_boxes: Tensor
    gt_labels: Tensor
    num_gts: Tensor

    @property
    def key(self) -> BatchKey:
        """(B, H, W, G): what sets every shape of a step on this batch."""
        num_imgs, _, height, width = self.images.shape
        return (num_imgs, height, width, self.gt_boxes.shape[1])

    def tensors(self) -> List[Tensor]:
        return [getattr(self, f.name) for f in fields(self)]

    def copy_(self, other: "PaddedBatch") -> "PaddedBatch":
        """``other``'s values into this batch's tensors (same key), in place:
        how a captured step's inputs change."""
        if other.key != self.key:
            raise ValueError(f"a batch of key {other.key} cannot fill one of key {self.key}")
        for mine, theirs in zip(self.tensors(), other.tensors()):
            mine.copy_(theirs, non_blocking=True)
        return self

    def masks(self) -> Tensor:
        """(B, H, W) bool, True on the canvas's padding (DETR's masks)."""
        _, _, height, width = self.images.shape
        rows = torch.arange(height, device=self.images.device)
        cols = torch.arange(width, device=self.images.device)
        return ((rows[None, :, None] >= self.image_sizes[:, 0, None, None])
                | (cols[None, None, :] >= self.image_sizes[:, 1, None, None]))

    def gt_valid(self) -> Tensor:
        """(B, G) bool: which GT slots hold a real box."""
        slots = torch.arange(self.gt_boxes.shape[1], device=self.num_gts.device)
        return slots[None] < self.num_gts[:, None]


def bucket(canvas_sizes: Sequence[Tuple[int, int]], gt_caps: Sequence[int],
           height: int, width: int, max_gts: int) -> Optional[Tuple[int, int, int]]:
    """The smallest canvas (by area) of ``canvas_sizes`` holding an
    ``height`` x ``width`` batch and the smallest cap of ``gt_caps`` holding
    ``max_gts`` boxes: (H, W, G), or None where none fits."""
    canvases = [(h, w) for h, w in canvas_sizes if h >= height and w >= width]
    caps = [g for g in gt_caps if g >= max_gts]
    if not canvases or not caps:
        return None
    canvas = min(canvases, key=lambda hw: (hw[0] * hw[1], hw))
    return (*canvas, min(caps))


def pad_batch(inputs: Tensor, batch_data_samples: Sequence, canvas: Tuple[int, int],
              gt_cap: int) -> PaddedBatch:
    """The batch mmdet's data preprocessor gives (``inputs`` (B, 3, h, w) on
    the device, each sample's ``img_shape`` and ``gt_instances``) as a
    PaddedBatch of canvas (H, W) >= (h, w) and ``gt_cap`` >= every image's GT
    count; the host-built parts in one copy that does not wait."""
    num_imgs, _, height, width = inputs.shape
    if len(batch_data_samples) != num_imgs:
        raise ValueError(f"one data sample per image expected: {num_imgs} images, "
                         f"{len(batch_data_samples)} samples")
    if height > canvas[0] or width > canvas[1]:
        raise ValueError(f"canvas {tuple(canvas)} is smaller than the batch ({height}, {width})")
    gts = [sample.gt_instances for sample in batch_data_samples]
    counts = [len(gt.labels) for gt in gts]
    if max(counts, default=0) > gt_cap:
        raise ValueError(f"gt_cap {gt_cap} is smaller than an image's {max(counts)} GT boxes")
    sizes = [tuple(sample.img_shape) for sample in batch_data_samples]
    device = inputs.device
    # Where each real box goes among the B * G slots.
    slots = [i * gt_cap + j for i, count in enumerate(counts) for j in range(count)]
    image_sizes, factors, num_gts, slot_index = to_device(
        [torch.tensor(sizes, dtype=torch.long).reshape(num_imgs, 2),
         torch.tensor([[w, h, w, h] for h, w in sizes], dtype=torch.float32).reshape(num_imgs, 4),
         torch.tensor(counts, dtype=torch.long), torch.tensor(slots, dtype=torch.long)], device)
    images = inputs.new_zeros((num_imgs, inputs.shape[1], *canvas))
    images[:, :, :height, :width] = inputs
    gt_boxes = torch.zeros(num_imgs * gt_cap, 4, device=device)
    gt_boxes[:, 2:] = 1.0
    gt_labels = torch.zeros(num_imgs * gt_cap, dtype=torch.long, device=device)
    if slots:
        gt_boxes.index_copy_(0, slot_index, torch.cat([gt.bboxes for gt in gts]).float())
        gt_labels.index_copy_(0, slot_index, torch.cat([gt.labels for gt in gts]).long())
    return PaddedBatch(images=images, image_sizes=image_sizes, factors=factors,
                       gt_boxes=gt_boxes.view(num_imgs, gt_cap, 4),
                       gt_labels=gt_labels.view(num_imgs, gt_cap), num_gts=num_gts)
