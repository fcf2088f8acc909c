"""The CUDA sources of mmcv's multi-scale deformable attention, read from the
user's own mmcv source distribution (``mmcv-X.tar.gz`` from PyPI).

msda_mm ships none of mmcv's code: ``extract_sources`` reads the four files
the op's kernels need out of the tarball and swaps the one include that
current PyTorch no longer has (``THC/THCAtomics.cuh``; its atomicAdd
overloads live in ``ATen/cuda/Atomic.cuh`` now).  ``download_sdist`` fetches
the tarball with pip.
"""
from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

# Paths below mmcv/ops/csrc/ in the sdist, kept as the layout of the build
# folder: the .cu includes the kernel header by name, which includes the helpers.
SOURCES = (
    "pytorch/cuda/ms_deform_attn_cuda.cu",
    "common/cuda/ms_deform_attn_cuda_kernel.cuh",
    "common/cuda/common_cuda_helper.hpp",
    "common/pytorch_cuda_helper.hpp",
)
CUDA_SOURCE = SOURCES[0]
# What the headers are included from (mmcv's own build passes the same two).
INCLUDE_DIRS = ("common", "common/cuda")
_CSRC = "mmcv/ops/csrc/"
_PKG_INFO = "PKG-INFO"

_THC_ATOMICS = b"#include <THC/THCAtomics.cuh>"
_ATEN_ATOMICS = b"#include <ATen/cuda/Atomic.cuh>"
_THC_INCLUDE = re.compile(rb"^\s*#\s*include\s*[<\"]THC/[^>\"]*[>\"]", re.MULTILINE)


class SdistError(ValueError):
    """The file is not an mmcv sdist with the op's CUDA sources."""


@dataclass
class MmcvSources:
    version: str  # the sdist's mmcv version (its PKG-INFO)
    sha256: str  # of the tarball
    files: dict[str, bytes]  # SOURCES path -> patched content


def _top_folder(names: list[str]) -> str:
    tops = {name.split("/", 1)[0] for name in names}
    if len(tops) != 1:
        raise SdistError(f"an sdist holds one top folder (mmcv-X/), this one holds "
                         f"{len(tops)}: {sorted(tops)[:5]}")
    return tops.pop()


def _version(pkg_info: bytes) -> str:
    match = re.search(rb"^Version:\s*(\S+)", pkg_info, re.MULTILINE)
    if match is None:
        raise SdistError(f"{_PKG_INFO} of the sdist has no 'Version:' line")
    return match.group(1).decode()


def patch(name: str, text: bytes) -> bytes:
    """``text`` of source ``name`` with THC/THCAtomics.cuh swapped for
    ATen/cuda/Atomic.cuh; raises SdistError if another THC include is left
    (the THC headers are gone from PyTorch since 1.11)."""
    text = text.replace(_THC_ATOMICS, _ATEN_ATOMICS)
    left = _THC_INCLUDE.findall(text)
    if left:
        raise SdistError(f"{name} includes {', '.join(s.decode().strip() for s in left)}, "
                         f"which current PyTorch does not have and msda_mm cannot replace")
    return text


def extract_sources(sdist) -> MmcvSources:
    """The patched SOURCES of the mmcv sdist at ``sdist`` (read in memory:
    nothing else of the tarball is unpacked)."""
    path = Path(sdist)
    if not path.is_file():
        raise SdistError(f"sdist: no such file: {path}")
    try:
        with tarfile.open(path) as tar:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}
            top = _top_folder(list(members))
            wanted = {rel: f"{top}/{_CSRC}{rel}" for rel in SOURCES}
            wanted[_PKG_INFO] = f"{top}/{_PKG_INFO}"
            missing = [name for name in wanted.values() if name not in members]
            if missing:
                raise SdistError(f"{path} is not an mmcv sdist with the CUDA sources of "
                                 f"multi-scale deformable attention: it lacks "
                                 f"{', '.join(missing)}")
            raw = {rel: tar.extractfile(members[name]).read() for rel, name in wanted.items()}
    # A truncated .tar.gz ends its gzip stream early (EOFError); corrupt
    # deflate data fails in zlib.
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise SdistError(f"sdist: {path} is not a readable tar archive "
                         f"({type(e).__name__}: {e}): truncated or damaged?") from None
    return MmcvSources(version=_version(raw.pop(_PKG_INFO)),
                       sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                       files={rel: patch(rel, text) for rel, text in raw.items()})


def sdist_url(pip_log: str, version: str) -> str:
    """The tarball URL that ``pip download -vv mmcv==version`` chose, from its log."""
    name = re.escape(f"mmcv-{version}.tar.gz")
    chosen = re.search(rf"Added mmcv=={re.escape(version)} from (\S+/{name})", pip_log)
    found = chosen or re.search(rf"Found link (\S+/{name})", pip_log)
    if found is None:
        raise SdistError(f"pip's log names no mmcv-{version}.tar.gz: is mmcv {version} on the "
                         f"package index pip uses? (pip download -vv --no-deps --no-binary "
                         f":all: mmcv=={version})")
    return found.group(1)


def download_sdist(version: str, folder) -> Path:
    """Fetch mmcv ``version``'s sdist into ``folder`` and return its path.

    ``pip download`` cannot keep it (building mmcv's metadata needs more than
    pip's isolated environment has), so the URL pip resolved is read from
    its log and fetched directly.
    """
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run([sys.executable, "-m", "pip", "download", "-vv", "--no-deps",
                              "--no-binary", ":all:", f"mmcv=={version}", "-d", tmp],
                             capture_output=True, text=True)
        url = sdist_url(run.stdout + run.stderr, version)
    target = Path(folder) / f"mmcv-{version}.tar.gz"
    target.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url) as response:
        target.write_bytes(response.read())
    return target
