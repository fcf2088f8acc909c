"""Whether a checkpoint file is whole: the sha256 written beside it when it
was saved (``<ckpt>.sha256``, in sha256sum's format, so ``sha256sum -c``
checks it too), else the CRC-32 that torch.save records for each record of
its zip archive."""
from __future__ import annotations

import hashlib
import os
import zipfile

DIGEST_SUFFIX = ".sha256"
_ZIP_MAGIC = b"PK\x03\x04"


class DamagedCheckpointError(RuntimeError):
    """A checkpoint that is truncated, empty or altered since it was saved."""


def digest_path(path: str) -> str:
    return path + DIGEST_SUFFIX


def digest_line(data: bytes, path: str) -> str:
    """sha256sum's line for ``data`` saved as ``path`` (named relative to its folder)."""
    return f"{hashlib.sha256(data).hexdigest()}  {os.path.basename(path)}\n"


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def _zip_problem(path: str) -> str | None:
    with open(path, "rb") as f:
        if f.read(4) != _ZIP_MAGIC:
            return None  # torch's pre-1.6 format records nothing to check against
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
            # torch.serialization.set_crc32_options(False) writes 0 for every CRC.
            if bad is None or all(info.CRC == 0 for info in archive.infolist()):
                return None
            return f"record {bad} fails its CRC-32 check"
    except zipfile.BadZipFile as error:
        return f"not a complete zip archive, as torch.save writes ({error}): truncated?"


def checkpoint_problem(path: str) -> str | None:
    """Why ``path`` is not a whole checkpoint, or None if it is (or nothing
    recorded says otherwise: an old-format file saved without a digest)."""
    if not os.path.isfile(path):
        return "no such file"
    if os.path.getsize(path) == 0:
        return "empty file (0 bytes)"
    if os.path.isfile(digest_path(path)):
        with open(digest_path(path), "rb") as f:
            line = f.read()
        try:
            expected = (line.decode("ascii").split() or ["nothing"])[0]
        except UnicodeDecodeError:
            return (f"{digest_path(path)} is not a sha256sum line (it holds non-ASCII bytes): "
                    f"damaged?")
        actual = _file_sha256(path)
        if actual != expected:
            return f"its sha256 {actual} is not the {expected} in {digest_path(path)}"
        return None
    return _zip_problem(path)
