"""Drawing of one synthetic shapes image and its boxes.

A cluttered, noisy gradient background with a few filled shapes of six
classes (varied size, aspect, rotation and colour, partly occluding each
other).  Easy enough that a DETR-style detector learns it in minutes, hard
enough that its AP means something.  Everything random comes from the
``numpy.random.Generator`` passed in, so one seed gives one image.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import cv2
import numpy as np

CLASSES = ("rectangle", "ellipse", "triangle", "cross", "ring", "star")
PALETTE = [(220, 20, 60), (0, 0, 142), (250, 170, 30), (0, 182, 199), (106, 0, 228),
           (0, 143, 149)]

_MAX_OBJECTS = 6
# A shape may hide at most this fraction of any earlier shape; otherwise the
# label would describe something mostly invisible.
_MAX_HIDDEN = 0.5
_PLACEMENT_TRIES = 10
# Minimum L1 distance (over RGB) between a shape's colour and the background
# under it: low-contrast shapes are allowed, invisible ones are not.
_MIN_CONTRAST = 120


def _rotate(points: np.ndarray, angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return points @ np.array([[c, s], [-s, c]])


def _polygon_mask(points: np.ndarray, centre: np.ndarray, angle: float,
                  size: tuple[int, int]) -> np.ndarray:
    mask = np.zeros(size, np.uint8)
    cv2.fillPoly(mask, [np.round(_rotate(points, angle) + centre).astype(np.int32)], 1)
    return mask


def _ellipse_mask(a: float, b: float, centre: np.ndarray, angle: float,
                  size: tuple[int, int]) -> np.ndarray:
    mask = np.zeros(size, np.uint8)
    cv2.ellipse(mask, (round(centre[0]), round(centre[1])), (round(a), round(b)),
                math.degrees(angle), 0, 360, 1, -1)
    return mask


def _rectangle(rng, a, b, centre, angle, size):
    return _polygon_mask(np.array([[-a, -b], [a, -b], [a, b], [-a, b]]), centre, angle, size)


def _ellipse(rng, a, b, centre, angle, size):
    return _ellipse_mask(a, b, centre, angle, size)


def _triangle(rng, a, b, centre, angle, size):
    apex = rng.uniform(-0.6, 0.6) * a
    return _polygon_mask(np.array([[apex, -b], [a, b], [-a, b]]), centre, angle, size)


def _cross(rng, a, b, centre, angle, size):
    t = rng.uniform(0.25, 0.4)
    ta, tb = t * a, t * b
    outline = [[-ta, -b], [ta, -b], [ta, -tb], [a, -tb], [a, tb], [ta, tb], [ta, b], [-ta, b],
               [-ta, tb], [-a, tb], [-a, -tb], [-ta, -tb]]
    return _polygon_mask(np.array(outline), centre, angle, size)


def _ring(rng, a, b, centre, angle, size):
    inner = rng.uniform(0.45, 0.65)
    outer = _ellipse_mask(a, b, centre, angle, size)
    return outer & (1 - _ellipse_mask(a * inner, b * inner, centre, angle, size))


def _star(rng, a, b, centre, angle, size):
    inner = rng.uniform(0.38, 0.5)
    k = np.arange(10)
    radius = np.where(k % 2 == 0, 1.0, inner)
    theta = k * math.pi / 5 - math.pi / 2
    return _polygon_mask(np.stack([a * radius * np.cos(theta), b * radius * np.sin(theta)], 1),
                         centre, angle, size)


_SHAPES: Sequence[Callable] = (_rectangle, _ellipse, _triangle, _cross, _ring, _star)
assert len(_SHAPES) == len(CLASSES)


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Linear colour gradient at a random angle plus low-frequency blotches."""
    c0, c1 = rng.uniform(0, 255, (2, 3))
    angle = rng.uniform(0, 2 * math.pi)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    t = (xs * math.cos(angle) + ys * math.sin(angle))
    t = (t - t.min()) / max(float(t.max() - t.min()), 1.0)
    img = c0 + (c1 - c0) * t[..., None]
    blotches = rng.normal(0, rng.uniform(0, 25), (max(h // 16, 2), max(w // 16, 2), 3))
    return img + cv2.resize(blotches.astype(np.float32), (w, h), interpolation=cv2.INTER_CUBIC)


def _clutter(rng: np.random.Generator, img: np.ndarray, count: int) -> None:
    """Thin lines, dots and open arcs: structure that is not an object."""
    h, w = img.shape[:2]
    side = min(h, w)
    for _ in range(count):
        colour = rng.uniform(0, 255, 3).tolist()
        kind = rng.integers(3)
        p = (int(rng.integers(w)), int(rng.integers(h)))
        if kind == 0:
            q = (int(rng.integers(w)), int(rng.integers(h)))
            cv2.line(img, p, q, colour, int(rng.integers(1, 3)))
        elif kind == 1:
            cv2.circle(img, p, int(rng.integers(1, max(side // 48, 2) + 1)), colour, -1)
        else:
            axes = tuple(int(v) for v in rng.integers(side // 16 + 1, side // 4 + 2, 2))
            start = float(rng.uniform(0, 360))
            cv2.ellipse(img, p, axes, 0, start, start + float(rng.uniform(30, 200)), colour, 1)


def _place(rng: np.random.Generator, shape: Callable, h: int, w: int,
           masks: list[np.ndarray], visible: list[np.ndarray]) -> np.ndarray | None:
    """A shape mask fully inside the image that leaves every earlier shape at
    least half visible, or None if none was found in a few tries."""
    side = min(h, w)
    for _ in range(_PLACEMENT_TRIES):
        extent = rng.uniform(max(12.0, 0.08 * side), 0.45 * side)
        aspect = math.exp(rng.uniform(-0.5, 0.5))
        a, b = extent * math.sqrt(aspect) / 2, extent / math.sqrt(aspect) / 2
        # The rotated shape stays within radius max(a, b) of its centre.
        r = max(a, b) + 1
        centre = np.array([rng.uniform(r, w - r), rng.uniform(r, h - r)])
        angle = rng.uniform(-math.pi / 6, math.pi / 6)
        mask = shape(rng, a, b, centre, angle, (h, w)).astype(bool)
        if mask.any() and all((v & ~mask).sum() >= (1 - _MAX_HIDDEN) * m.sum()
                              for m, v in zip(masks, visible, strict=True)):
            return mask
    return None


def render(rng: np.random.Generator, h: int, w: int) -> tuple[np.ndarray, list[dict]]:
    """One BGR uint8 image and its objects ({'category_id', 'bbox', 'area'},
    bbox in COCO xywh pixels of the visible part, category_id 1-based)."""
    img = _background(rng, h, w)
    _clutter(rng, img, int(rng.integers(0, 12)))
    labels, masks, visible = [], [], []
    for _ in range(int(rng.integers(1, _MAX_OBJECTS + 1))):
        label = int(rng.integers(len(CLASSES)))
        mask = _place(rng, _SHAPES[label], h, w, masks, visible)
        if mask is None:
            continue
        under = img[mask].mean(0)
        colour = rng.uniform(0, 255, 3)
        while np.abs(colour - under).sum() < _MIN_CONTRAST:
            colour = rng.uniform(0, 255, 3)
        img[mask] = colour
        visible = [v & ~mask for v in visible]
        labels.append(label)
        masks.append(mask)
        visible.append(mask.copy())
    # A few strokes on top cut across shapes without hiding them.
    _clutter(rng, img, int(rng.integers(0, 3)))
    img += rng.normal(0, rng.uniform(0, 8), img.shape)
    objects = []
    for label, vis in zip(labels, visible, strict=True):
        ys, xs = np.nonzero(vis)
        x0, y0 = int(xs.min()), int(ys.min())
        objects.append(dict(category_id=label + 1, area=int(vis.sum()),
                            bbox=[x0, y0, int(xs.max()) - x0 + 1, int(ys.max()) - y0 + 1]))
    return np.clip(np.round(img), 0, 255).astype(np.uint8), objects
