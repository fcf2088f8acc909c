"""mmdet's ``bbox_overlaps`` without its device copy: the epsilon clamps as a
Python float, where mmdet copies it to the device first (``new_tensor``, a
pageable copy that waits on CUDA)."""
from __future__ import annotations

import torch
from torch import Tensor

_MODES = ("iou", "iof", "giou")


def _check_boxes(name: str, boxes: Tensor) -> None:
    if boxes.dim() < 2 or (boxes.shape[-1] != 4 and boxes.shape[-2] != 0):
        raise ValueError(f"{name} must be (..., n, 4) boxes, got shape {tuple(boxes.shape)}")


def bbox_overlaps(bboxes1: Tensor, bboxes2: Tensor, mode: str = "iou", is_aligned: bool = False,
                  eps: float = 1e-6) -> Tensor:
    """``mmdet.structures.bbox.bbox_overlaps``, the same numbers: the same
    elementwise operations in the same order, the pairwise case by
    broadcasting (..., rows, 1, 4) against (..., 1, cols, 4).

    Args:
        bboxes1: (..., rows, 4) boxes (x1, y1, x2, y2).
        bboxes2: (..., cols, 4), the same leading dimensions.
        mode: 'iou', 'iof' (over bboxes1's area) or 'giou'.
        is_aligned: pair row i with row i (rows == cols) instead of every
            row with every row.
        eps: the least union and enclosing area.

    Returns:
        (..., rows) if aligned, else (..., rows, cols).  Where a union or
        enclosing area equals ``eps`` exactly, its gradient is clamp's (all
        of it), where mmdet's ``torch.max`` gives half.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    _check_boxes("bboxes1", bboxes1)
    _check_boxes("bboxes2", bboxes2)
    batch_shape = bboxes1.shape[:-2]
    if bboxes2.shape[:-2] != batch_shape:
        raise ValueError(f"bboxes1 and bboxes2 must have the same leading dimensions, got "
                         f"{tuple(bboxes1.shape)} and {tuple(bboxes2.shape)}")
    rows, cols = bboxes1.shape[-2], bboxes2.shape[-2]
    if is_aligned and rows != cols:
        raise ValueError(f"is_aligned=True pairs the boxes row by row: bboxes1 has {rows}, "
                         f"bboxes2 {cols}")
    if rows * cols == 0:  # mmdet's empty result: bboxes1's dtype, no graph
        return bboxes1.new_empty(batch_shape + ((rows,) if is_aligned else (rows, cols)))
    if not is_aligned:
        bboxes1, bboxes2 = bboxes1[..., :, None, :], bboxes2[..., None, :, :]
    area1 = (bboxes1[..., 2] - bboxes1[..., 0]) * (bboxes1[..., 3] - bboxes1[..., 1])
    area2 = (bboxes2[..., 2] - bboxes2[..., 0]) * (bboxes2[..., 3] - bboxes2[..., 1])
    lt = torch.max(bboxes1[..., :2], bboxes2[..., :2])
    rb = torch.min(bboxes1[..., 2:], bboxes2[..., 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[..., 0] * wh[..., 1]
    union = (area1 + area2 - overlap if mode != "iof" else area1).clamp(min=eps)
    ious = overlap / union
    if mode != "giou":
        return ious
    enclose_wh = (torch.max(bboxes1[..., 2:], bboxes2[..., 2:])
                  - torch.min(bboxes1[..., :2], bboxes2[..., :2])).clamp(min=0)
    enclose_area = (enclose_wh[..., 0] * enclose_wh[..., 1]).clamp(min=eps)
    return ious - (enclose_area - union) / enclose_area
