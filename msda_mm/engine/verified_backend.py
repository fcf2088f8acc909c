"""mmengine's local storage backend with atomic writes and a sha256 beside
each file: what VerifiedCheckpointHook saves its checkpoints through."""
from __future__ import annotations

import os
import os.path as osp
import tempfile

from mmengine.fileio import LocalBackend, register_backend

from .checkpoint_integrity import digest_line, digest_path

BACKEND = "msda_mm_verified_local"


def write_atomically(path: str, data: bytes) -> None:
    """``path`` holds all of ``data`` or what it held before, never a part:
    written to a temporary file beside it, flushed to disk, then renamed."""
    folder = osp.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=osp.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.remove(tmp)
        raise


@register_backend(BACKEND)
class VerifiedLocalBackend(LocalBackend):
    """``put`` writes the file atomically, then its ``<file>.sha256``;
    ``remove`` removes both."""

    def put(self, obj: bytes, filepath) -> None:
        filepath = str(filepath)
        # The old digest goes first: a stop between the two writes leaves
        # no digest (the zip's own CRCs are checked) rather than a wrong one.
        if osp.isfile(digest_path(filepath)):
            os.remove(digest_path(filepath))
        write_atomically(filepath, obj)
        write_atomically(digest_path(filepath), digest_line(obj, filepath).encode())

    def remove(self, filepath) -> None:
        super().remove(filepath)
        if osp.isfile(digest_path(str(filepath))):
            os.remove(digest_path(str(filepath)))
