"""Writing a synthetic shapes dataset to disk in COCO layout.

Every image draws from its own random stream, seeded by (seed, split,
index), and files are written with fixed PNG settings and sorted-key JSON:
the same arguments give the same bytes, whatever the number of threads.

The writer only writes into an empty folder or one of its own trees: one
with its marker (complete) or its claim (a write that did not finish).
"""
from __future__ import annotations

import fcntl
import json
import os
import uuid
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np

from .render import CLASSES, render

SPLITS = ("train", "val")
# The arguments of a complete tree, written last.
MARKER = ".synthetic.json"
# Written first and removed after MARKER: the folder is this writer's while
# a write is under way or after one that stopped half way.
CLAIM = ".synthetic.writing"
LOCK = ".generate.lock"
# Bump when the drawing changes, so a tree written by an older generator is
# not silently reused as if it were what these arguments produce.
FORMAT_VERSION = 1
_PNG_PARAMS = [cv2.IMWRITE_PNG_COMPRESSION, 3]


def ann_file(split: str) -> str:
    """Annotation path of a split, relative to the dataset root."""
    return f"annotations/instances_{split}.json"


def _image_rng(seed: int, split: str, index: int) -> np.random.Generator:
    # crc32 rather than hash(): str hashes are salted per process.
    return np.random.default_rng([seed, zlib.crc32(split.encode()), index])


def _write_atomic(path: Path, data: bytes) -> None:
    # A temporary name of its own in the same folder, renamed over the file:
    # writers never share one, and readers see whole files only.
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _default_workers() -> int:
    return min(len(os.sched_getaffinity(0)), 16)


def _write_image(out: Path, split: str, index: int, size: tuple[int, int],
                 seed: int) -> list[dict]:
    img, objects = render(_image_rng(seed, split, index), *size)
    ok, png = cv2.imencode(".png", img, _PNG_PARAMS)
    assert ok, "OpenCV failed to encode a PNG"
    _write_atomic(out / split / f"{index:06d}.png", png.tobytes())
    return objects


def generate_split(out: Path, split: str, num_images: int, size: tuple[int, int], seed: int,
                   workers: int | None = None) -> None:
    """Write ``out/<split>/*.png`` and ``out/annotations/instances_<split>.json``.

    Images are drawn on ``workers`` threads (default: the usable cores, at
    most 16): numpy and OpenCV release the GIL for the heavy work, and each
    image has its own random stream, so the output does not depend on it.
    """
    h, w = size
    (out / split).mkdir(parents=True, exist_ok=True)
    (out / "annotations").mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(workers or _default_workers()) as pool:
        per_image = list(pool.map(lambda i: _write_image(out, split, i, size, seed),
                                  range(num_images)))
    images, annotations = [], []
    for index, objects in enumerate(per_image):
        image_id = index + 1
        images.append(dict(id=image_id, file_name=f"{index:06d}.png", height=h, width=w))
        for obj in objects:
            annotations.append(dict(obj, id=len(annotations) + 1, image_id=image_id, iscrowd=0))
    coco = dict(images=images, annotations=annotations,
                categories=[dict(id=i + 1, name=n, supercategory="shape")
                            for i, n in enumerate(CLASSES)],
                info=dict(description=f"msda_mm synthetic shapes, {split}, seed {seed}"))
    _write_atomic(out / ann_file(split), json.dumps(coco, sort_keys=True).encode())


def marker(num_train: int, num_val: int, size: Sequence[int], seed: int) -> dict:
    """What the marker file of a tree generated with these arguments holds."""
    return dict(num_train=int(num_train), num_val=int(num_val), size=[int(s) for s in size],
                seed=int(seed), version=FORMAT_VERSION)


def _check_ours(out: Path) -> None:
    """ValueError unless ``out`` is missing, empty (but for the lock), or
    this writer's (one listing, so that a claim made meanwhile is seen with
    the files written after it)."""
    names = {p.name for p in out.iterdir()} if out.is_dir() else set()
    if MARKER in names or CLAIM in names:
        return
    found = sorted(names - {LOCK})
    if found:
        raise ValueError(f"{out} is not empty and has no {MARKER} of msda_mm's synthetic data "
                         f"writer (found {found[0]!r} and {len(found) - 1} other entries): "
                         f"refusing to write into it; use an empty or new folder")


def _read_marker(out: Path) -> dict | None:
    """The arguments of the complete tree under ``out``, or None."""
    path = out / MARKER
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is truncated or corrupt ({error}): delete {out} and run "
                         f"again to regenerate the synthetic data") from error


def check_arguments(num_train: int, num_val: int, size: Sequence[int]) -> tuple[int, int]:
    """ValueError naming the argument unless the image counts are >= 0 and
    the images at least 32 x 32; returns ``size`` as (H, W) ints."""
    for name, count in (("num_train", num_train), ("num_val", num_val)):
        if int(count) != count or count < 0:
            raise ValueError(f"{name} must be a whole number of images >= 0, got {count!r}")
    size = (int(size[0]), int(size[1]))
    if min(size) < 32:
        # Below that the size range of the shapes is empty (and mmdet's
        # default filter drops images under 32 pixels anyway).
        raise ValueError(f"synthetic images must be at least 32 x 32, got {size}")
    return size


def _make_folder(out: Path) -> None:
    """``out`` and its parents, or ValueError saying why not (a file in the
    way, no permission, a read-only file system)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file, not a folder: the synthetic data needs a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"cannot make the synthetic data folder {out}: "
                         f"{error.strerror or error}") from error


def generate(out: str | os.PathLike, num_train: int, num_val: int, size: Sequence[int],
             seed: int = 0, workers: int | None = None) -> None:
    """Write both splits under ``out`` (empty, missing, or a tree of this
    writer's, else ValueError), then the marker recording the arguments:
    written last, so a tree without it is incomplete.  No lock: one writer
    at a time (ensure_generated serialises them)."""
    out = Path(out)
    size = check_arguments(num_train, num_val, size)
    _check_ours(out)
    _make_folder(out)
    (out / CLAIM).touch()
    (out / MARKER).unlink(missing_ok=True)  # before the first file changes
    for split, num in zip(SPLITS, (num_train, num_val), strict=True):
        generate_split(out, split, num, size, seed, workers)
    _write_atomic(out / MARKER, json.dumps(marker(num_train, num_val, size, seed),
                                           sort_keys=True).encode())
    (out / CLAIM).unlink(missing_ok=True)


def ensure_generated(out: str | os.PathLike, num_train: int, num_val: int,
                     size: Sequence[int], seed: int = 0, workers: int | None = None) -> bool:
    """Generate the tree under ``out`` unless it is already there; True if
    this call wrote it.

    Safe for several processes at once (DDP ranks, even on several nodes
    sharing a file system, or two command lines): they serialise on an
    exclusive lock in ``out``; the first writes, the others then find the
    marker and return.  Raises ValueError if ``out`` holds a tree generated
    with other arguments, rather than train on data that differs from what
    the config says, or anything not written by this writer.
    """
    out = Path(out)
    want = marker(num_train, num_val, check_arguments(num_train, num_val, size), seed)
    _make_folder(out)
    lock_path = out / LOCK
    new_lock = not lock_path.exists()
    try:
        lock = open(lock_path, "a")
    except OSError as error:
        raise ValueError(f"cannot write into the synthetic data folder {out}: "
                         f"{error.strerror or error}") from error
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            _check_ours(out)  # under the lock: no other writer is half way
        except ValueError:
            if new_lock:  # leave a folder that is not ours as it was
                lock_path.unlink(missing_ok=True)
            raise
        have = _read_marker(out)
        if have is None:
            generate(out, num_train, num_val, size, seed, workers)
            return True
        if have != want:
            raise ValueError(f"{out} holds synthetic data generated with {have}, but "
                             f"{want} was asked for: delete it or use another data_root")
        return False
