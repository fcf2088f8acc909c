"""DINO-like matching problems: the cost matrices that mmdet's
HungarianAssigner builds with DINO's match costs (FocalLossCost 2.0,
BBoxL1Cost 5.0, IoUCost giou 2.0) between random queries and GT boxes."""
from __future__ import annotations

import torch

NUM_CLASSES = 80
# DINO's match cost weights: class (focal), box L1, GIoU.
CLASS_WEIGHT, L1_WEIGHT, GIOU_WEIGHT = 2.0, 5.0, 2.0


def _xyxy(cxcywh: torch.Tensor) -> torch.Tensor:
    c, half = cxcywh[..., :2], cxcywh[..., 2:] / 2
    return torch.cat([c - half, c + half], dim=-1)


def _giou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(..., N, G) generalised IoU of xyxy boxes a (..., N, 4), b (..., G, 4)."""
    a, b = a[..., :, None, :], b[..., None, :, :]
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    overlap = torch.minimum(a[..., 2:], b[..., 2:]) - torch.maximum(a[..., :2], b[..., :2])
    inter = overlap.clamp(min=0).prod(dim=-1)
    union = area_a + area_b - inter
    hull = torch.maximum(a[..., 2:], b[..., 2:]) - torch.minimum(a[..., :2], b[..., :2])
    hull_area = hull[..., 0] * hull[..., 1]
    return inter / union - (hull_area - union) / hull_area


def dino_like_costs(num_problems: int, num_queries: int, max_gts: int, seed: int,
                    device, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(cost (P, N, G) in ``dtype``, num_cols (P,) int32) on ``device``.

    GT boxes are uniform (normalised cxcywh, sides 0.05..0.5); a third of
    the queries are jittered copies of GT boxes (as trained queries
    cluster on objects), the others random; class logits are N(0, 2).
    num_cols: the first problem has max_gts GT boxes, the others
    1..max_gts; the columns past it hold what a padded GT slot gives."""
    gen = torch.Generator().manual_seed(seed)
    P, N, G = num_problems, num_queries, max_gts

    def rand(*shape):
        return torch.rand(*shape, generator=gen)

    gt = torch.cat([rand(P, G, 2) * 0.8 + 0.1, rand(P, G, 2) * 0.45 + 0.05], dim=-1)
    labels = torch.randint(0, NUM_CLASSES, (P, G), generator=gen)
    boxes = torch.cat([rand(P, N, 2) * 0.8 + 0.1, rand(P, N, 2) * 0.45 + 0.05], dim=-1)
    near = torch.randint(0, G, (P, N // 3), generator=gen)
    jitter = 1 + 0.1 * torch.randn(P, N // 3, 4, generator=gen)
    boxes[:, :N // 3] = torch.gather(gt, 1, near[..., None].expand(-1, -1, 4)) * jitter
    prob = torch.sigmoid(2 * torch.randn(P, N, NUM_CLASSES, generator=gen))
    prob = torch.gather(prob, 2, labels[:, None, :].expand(-1, N, -1))
    # FocalLossCost (alpha 0.25, gamma 2) of each query's score for the GT's class.
    pos = -0.25 * (1 - prob) ** 2 * torch.log(prob + 1e-12)
    neg = -0.75 * prob ** 2 * torch.log(1 - prob + 1e-12)
    cost = (CLASS_WEIGHT * (pos - neg) + L1_WEIGHT * torch.cdist(boxes, gt, p=1)
            - GIOU_WEIGHT * _giou(_xyxy(boxes), _xyxy(gt)))
    num_cols = torch.randint(1, G + 1, (P,), generator=gen, dtype=torch.int32)
    num_cols[0] = G
    return cost.to(device=device, dtype=dtype), num_cols.to(device)
