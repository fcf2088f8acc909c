"""A stand-in for mmcv's compiled extension ``mmcv._ext`` on mmcv-lite.

mmcv-lite ships ``mmcv.ops`` without ``mmcv._ext``, and every ``mmcv.ops``
module loads its kernels from it at import time, so ``import mmcv.ops`` (and
with it ``import mmdet.models``) fails.  The stub lets those imports succeed:
each kernel name resolves to a callable that raises a ``RuntimeError`` naming
the op and the way out only when it is actually called.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

import mmcv

EXT_NAME = "mmcv._ext"

# mmcv.utils.collect_env() reports these; on plain mmcv-lite it says 'n/a'
# (``from mmcv.ops import ...`` fails there), so the stub keeps saying that
# instead of raising.
_BUILD_INFO = ("get_compiler_version", "get_compiling_cuda_version")


def _compiled_only(name: str):
    def op(*args, **kwargs):
        raise RuntimeError(
            f"mmcv op '{name}' needs compiled mmcv (mmcv-full), but only mmcv-lite is "
            f"installed. Install mmcv built with its ops (e.g. `mim install mmcv`), or, for "
            f"multi-scale deformable attention, use msda_mm's Triton op "
            f"(msda_mm.multi_scale_deformable_attention / type='TritonMSDeformAttn').")
    op.__name__ = op.__qualname__ = name
    return op


class CompiledOpsStub(types.ModuleType):
    """``mmcv._ext`` without kernels: any public attribute is an op that
    raises when called (``ext_loader.load_ext`` only checks ``hasattr``)."""

    def __getattr__(self, name: str):
        # Private and dunder names stay missing so that introspection
        # (copy, pickle, inspect, pytest) sees an ordinary module.
        if name.startswith("_"):
            raise AttributeError(name)
        return _compiled_only(name)


def _new_stub() -> CompiledOpsStub:
    stub = CompiledOpsStub(EXT_NAME, __doc__)
    # loader=None: importlib.util.find_spec / pkgutil.find_loader keep
    # reporting "no compiled ops" (mmcv.utils.ext_loader.check_ops_exist()
    # stays False) instead of raising on a spec-less module.
    stub.__spec__ = importlib.machinery.ModuleSpec(EXT_NAME, loader=None, origin="msda_mm")
    for name in _BUILD_INFO:
        setattr(stub, name, lambda: "n/a")
    return stub


def is_stubbed() -> bool:
    """True when ``mmcv._ext`` is msda_mm's stub (mmcv-lite)."""
    return isinstance(sys.modules.get(EXT_NAME), CompiledOpsStub)


def install() -> bool:
    """Install the stub as ``mmcv._ext`` unless mmcv has a compiled one.

    A real extension, found on disk or already imported, is left alone even
    if it would fail to load: then mmcv's own error is the right one.
    Returns ``is_stubbed()``.
    """
    if EXT_NAME in sys.modules:
        return is_stubbed()
    if importlib.util.find_spec(EXT_NAME) is not None:
        return False
    stub = _new_stub()
    sys.modules[EXT_NAME] = stub
    mmcv._ext = stub  # what a real import would bind on the parent package
    return True
