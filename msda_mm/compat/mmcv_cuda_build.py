"""Build mmcv's own CUDA kernels of multi-scale deformable attention from the
user's mmcv sdist, for the local GPU, and load the result.

mmcv-lite has no compiled ops; these kernels are the baseline msda_mm's are
measured and checked against (tools/build_mmcv_msda.py builds them,
``msda_mm.compat.mmcv_cuda_switch`` puts them under mmcv's
``MultiScaleDeformableAttention``).  A build is one folder, by default
``~/.cache/msda_mm/mmcv_msda/<mmcv>-torch<torch>-sm<capability>``: the
patched sources (src/), the binding, torch.utils.cpp_extension's build files
and library, and manifest.json, which says what it was built from and for.
"""
from __future__ import annotations

import importlib.util
import json
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Optional

import mmcv
import torch
from torch.utils import cpp_extension

from .mmcv_cuda_binding import BINDING
from .mmcv_sdist import CUDA_SOURCE, INCLUDE_DIRS, MmcvSources, extract_sources

MODULE = "msda_mm_mmcv_msda"
MANIFEST = "manifest.json"
LOG = "build.log"
OPS = ("ms_deform_attn_forward", "ms_deform_attn_backward")
BUILD_TOOL = "python tools/build_mmcv_msda.py --sdist mmcv-{}.tar.gz (or --download)"


class BuildError(RuntimeError):
    """mmcv's MSDA kernels cannot be built or loaded here; the message says why."""


@dataclass
class Manifest:
    mmcv: str
    torch: str
    cuda: str
    capability: str  # "9.0"
    arch_list: str  # TORCH_CUDA_ARCH_LIST of the build
    sdist: str
    sdist_sha256: str
    module: str
    library: str  # file name inside the build folder


def local_capability() -> tuple[int, int]:
    """Compute capability of the current CUDA device."""
    if not torch.cuda.is_available():
        raise BuildError("no CUDA device is visible: mmcv's MSDA kernels are built for and "
                         "run on the local GPU")
    return torch.cuda.get_device_capability()


def check_toolchain() -> None:
    """Raise BuildError unless torch, a GPU, nvcc and ninja can build a CUDA extension."""
    if torch.version.cuda is None:
        raise BuildError(f"torch {torch.__version__} is built without CUDA: install a CUDA "
                         f"build of torch to build mmcv's MSDA kernels")
    local_capability()
    home = cpp_extension.CUDA_HOME
    if home is None:
        raise BuildError("no CUDA toolkit found (no CUDA_HOME, no nvcc on PATH, no "
                         "/usr/local/cuda): install one and set CUDA_HOME to its folder")
    if not (Path(home) / "bin" / "nvcc").is_file():
        raise BuildError(f"CUDA_HOME={home} has no bin/nvcc: point CUDA_HOME at a CUDA "
                         f"toolkit's folder")
    if not cpp_extension.is_ninja_available():
        raise BuildError("ninja is missing (torch.utils.cpp_extension builds with it): "
                         "pip install ninja")


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "msda_mm" / "mmcv_msda"


def default_build_dir(mmcv_version: str = mmcv.__version__,
                      capability: Optional[tuple[int, int]] = None) -> Path:
    """The cache folder of a build for this mmcv, this torch and the local GPU."""
    major, minor = capability or local_capability()
    return cache_root() / f"{mmcv_version}-torch{torch.__version__}-sm{major}{minor}"


def read_manifest(folder: Path) -> Optional[Manifest]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    return Manifest(**json.loads(path.read_text()))


@contextmanager
def _arch_list(value: str):
    # cpp_extension reads TORCH_CUDA_ARCH_LIST at build time; only the
    # user's own setting outlives the build.
    old = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ["TORCH_CUDA_ARCH_LIST"]
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = old


def write_sources(sources: MmcvSources, folder: Path) -> tuple[list[str], list[str]]:
    """Lay out ``sources`` and the binding in ``folder``; returns the
    (sources, include paths) to compile."""
    src = folder / "src"
    for rel, text in sources.files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(text)
    (folder / "binding.cpp").write_text(BINDING)
    return ([str(folder / "binding.cpp"), str(src / CUDA_SOURCE)],
            [str(src / d) for d in INCLUDE_DIRS])


def _compile(folder: Path, files: list[str], includes: list[str], arch_list: str) -> ModuleType:
    log = folder / LOG
    with _arch_list(arch_list):
        try:
            # verbose=False: ninja's output comes back in the exception.  -O3:
            # mmcv's setup.py build optimises host code with Python's CFLAGS
            # (-O3), a JIT build does not unless asked.
            module = cpp_extension.load(name=MODULE, sources=files, extra_include_paths=includes,
                                        extra_cflags=["-O3"], extra_cuda_cflags=["-O3"],
                                        build_directory=str(folder), verbose=False)
        except Exception as e:
            log.write_text(f"{type(e).__name__}: {e}\n")
            raise BuildError(f"compiling mmcv's MSDA kernels failed; the compiler's output is "
                             f"in {log}") from None
    return module


@dataclass
class Build:
    folder: Path
    manifest: Manifest
    compiled: bool  # False: an earlier build of the same sdist was reused

    @property
    def library(self) -> Path:
        return self.folder / self.manifest.library


def build(sdist, folder=None, force: bool = False) -> Build:
    """Build mmcv's MSDA kernels from ``sdist`` (an mmcv-X.tar.gz) for the
    local GPU into ``folder`` (default: default_build_dir()); a folder that
    already holds a build of the same sdist for this torch is reused unless
    ``force``."""
    sources = extract_sources(sdist)
    if sources.version != mmcv.__version__:
        raise BuildError(f"sdist {sdist} is mmcv {sources.version}, but mmcv "
                         f"{mmcv.__version__} is installed: build from the sdist of the "
                         f"installed mmcv, whose Python side calls these kernels")
    check_toolchain()
    major, minor = local_capability()
    folder = Path(folder) if folder is not None else default_build_dir(sources.version,
                                                                       (major, minor))
    cached = read_manifest(folder)
    if (not force and cached is not None and cached.sdist_sha256 == sources.sha256
            and cached.torch == torch.__version__ and (folder / cached.library).is_file()):
        return Build(folder, cached, compiled=False)
    folder.mkdir(parents=True, exist_ok=True)
    # Until this build succeeds the folder holds none.
    (folder / MANIFEST).unlink(missing_ok=True)
    files, includes = write_sources(sources, folder)
    arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST") or f"{major}.{minor}"
    module = _compile(folder, files, includes, arch_list)
    manifest = Manifest(mmcv=sources.version, torch=torch.__version__, cuda=torch.version.cuda,
                        capability=f"{major}.{minor}", arch_list=arch_list,
                        sdist=str(Path(sdist).resolve()), sdist_sha256=sources.sha256,
                        module=module.__name__, library=Path(module.__file__).name)
    _register(folder / manifest.library, module, manifest)
    (folder / MANIFEST).write_text(json.dumps(asdict(manifest), indent=1) + "\n")
    return Build(folder, manifest, compiled=True)


# Each library is imported once a process (cpp_extension.load imports the one it builds).
_LOADED: dict[Path, ModuleType] = {}


def _register(library: Path, module: ModuleType, manifest: Manifest) -> None:
    missing = [op for op in OPS if not hasattr(module, op)]
    if missing:
        raise BuildError(f"{library} lacks {', '.join(missing)}: not a build of mmcv's "
                         f"MSDA kernels")
    module.msda_mm_manifest = manifest
    _LOADED[library.resolve()] = module


def _import_library(library: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None:
        raise BuildError(f"{library} is not a loadable Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (ImportError, OSError) as e:
        raise BuildError(f"cannot load {library} ({e}): rebuild it with "
                         f"{BUILD_TOOL.format(mmcv.__version__)}") from None
    return module


def load_extension(path=None) -> ModuleType:
    """The built kernels as a module with ``ms_deform_attn_forward`` and
    ``ms_deform_attn_backward`` (mmcv._ext's signatures).  ``path``: a build
    folder, or None for default_build_dir()."""
    folder = Path(path) if path is not None else default_build_dir()
    manifest = read_manifest(folder)
    if manifest is None:
        raise BuildError(f"no build of mmcv's MSDA kernels in {folder} (no {MANIFEST}): build "
                         f"one with {BUILD_TOOL.format(mmcv.__version__)}")
    if manifest.torch != torch.__version__:
        raise BuildError(f"{folder} was built for torch {manifest.torch}, this is torch "
                         f"{torch.__version__}: rebuild with "
                         f"{BUILD_TOOL.format(manifest.mmcv)}")
    here = "{}.{}".format(*local_capability()) if torch.cuda.is_available() else None
    if here not in (None, manifest.capability):
        raise BuildError(f"{folder} was built for compute capability {manifest.capability}, "
                         f"this GPU's is {here}: rebuild it here")
    library = (folder / manifest.library).resolve()
    if library not in _LOADED:
        _register(library, _import_library(library, manifest.module), manifest)
    return _LOADED[library]


def describe(module: ModuleType) -> str:
    """Where a module of mmcv's kernels comes from, for reports."""
    manifest = getattr(module, "msda_mm_manifest", None)
    if manifest is None:
        return f"mmcv CUDA kernels ({module.__name__})"
    return f"mmcv {manifest.mmcv} CUDA kernels (msda_mm build, sm {manifest.capability})"


def found_build() -> Optional[Path]:
    """default_build_dir() if it holds a build (on a CUDA device), else None."""
    if not torch.cuda.is_available():
        return None
    folder = default_build_dir()
    return folder if read_manifest(folder) is not None else None
