"""Run mmcv's own CUDA kernels under mmcv's ``MultiScaleDeformableAttention``
on mmcv-lite: the baseline msda_mm's Triton op is measured and checked against.

mmcv's ``MultiScaleDeformableAttnFunction`` calls
``ext_module.ms_deform_attn_forward/backward``, ``ext_module`` being a
global of ``mmcv.ops.multi_scale_deform_attn`` read at call time; on
mmcv-lite that is msda_mm's stub and the Function's ``apply`` is routed to
msda_mm's op (``mmcv_msda``).  The switch points ``ext_module`` at a module
of kernels (msda_mm's build of mmcv's sources, ``mmcv_cuda_build``, or any
module with those two functions) and gives the Function back its own
``apply``.  Three ways to turn it on:

* ``use_mmcv_cuda_msda(path_or_module=None)`` (``mmcv_cuda_msda`` for a block);
* ``MSDA_MM_MMCV_CUDA=1`` (the build for this GPU) or ``=FOLDER`` when
  msda_mm is imported;
* in a config, ``custom_imports=dict(imports=['msda_mm',
  'msda_mm.compat.with_mmcv_cuda'])``.

Without a CUDA device the last two do nothing: mmcv's forward computes CPU
tensors in PyTorch and never reaches the Function.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from types import ModuleType
from typing import Callable, Iterator, Mapping, Optional

import torch
from mmcv.ops import multi_scale_deform_attn

from . import ext_stub, mmcv_msda

ENV = "MSDA_MM_MMCV_CUDA"
# What mmcv's module passes unless configured otherwise (mmdet's DINO keeps it).
IM2COL_STEP = 64
_OFF = ("", "0")
_DEFAULT = "1"
_FUNCTION = multi_scale_deform_attn.MultiScaleDeformableAttnFunction


def _kernels(source) -> ModuleType:
    # Imported here: the builder (torch's cpp_extension, the sdist reader)
    # loads only when the switch is used, not with msda_mm.
    from . import mmcv_cuda_build

    if isinstance(source, ModuleType):
        missing = [op for op in mmcv_cuda_build.OPS if not hasattr(source, op)]
        if missing:
            raise TypeError(f"kernels module {source.__name__} lacks {', '.join(missing)}")
        return source
    if source is None or isinstance(source, (str, os.PathLike)):
        return mmcv_cuda_build.load_extension(source)
    raise TypeError(f"kernels must be a module, a build folder or None, "
                    f"got {type(source).__name__}")


def mmcv_function(value, spatial_shapes, level_start_index, sampling_locations,
                  attention_weights):
    """``MultiScaleDeformableAttnFunction.apply`` as mmcv's module calls it,
    on whatever the Function is routed to now."""
    return _FUNCTION.apply(value, spatial_shapes, level_start_index, sampling_locations,
                           attention_weights, IM2COL_STEP)


def use_mmcv_cuda_msda(kernels=None) -> ModuleType:
    """From now on mmcv's MultiScaleDeformableAttnFunction (and so mmcv's
    module on CUDA tensors) runs ``kernels``: a module with mmcv._ext's
    ``ms_deform_attn_forward/backward``, a build folder, or None for the
    build for this GPU (mmcv_cuda_build.default_build_dir).  Returns the module."""
    if not ext_stub.is_stubbed():
        raise RuntimeError("mmcv is compiled (mmcv._ext is its own): its "
                           "MultiScaleDeformableAttention runs mmcv's CUDA kernels already")
    module = _kernels(kernels)
    multi_scale_deform_attn.ext_module = module
    if "apply" in vars(_FUNCTION):
        del _FUNCTION.apply  # torch.autograd.Function's own apply again
    return module


def use_triton_msda() -> None:
    """Back to mmcv-lite's default: mmcv's Function runs msda_mm's Triton op."""
    multi_scale_deform_attn.ext_module = sys.modules[ext_stub.EXT_NAME]
    mmcv_msda.route_function_to_triton()


def active() -> Optional[ModuleType]:
    """The kernels module the switch put under mmcv's Function, or None."""
    module = multi_scale_deform_attn.ext_module
    if ext_stub.is_stubbed() and not isinstance(module, ext_stub.CompiledOpsStub) \
            and "apply" not in vars(_FUNCTION):
        return module
    return None


@contextmanager
def _kept_route() -> Iterator[None]:
    """Whatever the block does to mmcv's Function and kernels is undone on exit."""
    ext, apply = multi_scale_deform_attn.ext_module, vars(_FUNCTION).get("apply")
    try:
        yield
    finally:
        multi_scale_deform_attn.ext_module = ext
        if apply is not None:
            _FUNCTION.apply = apply
        elif "apply" in vars(_FUNCTION):
            del _FUNCTION.apply


@contextmanager
def mmcv_cuda_msda(kernels=None) -> Iterator[ModuleType]:
    """``use_mmcv_cuda_msda(kernels)`` inside the block only; yields the module."""
    with _kept_route():
        yield use_mmcv_cuda_msda(kernels)


@contextmanager
def function_routed_to(fn: Callable) -> Iterator[None]:
    """Inside the block ``MultiScaleDeformableAttnFunction.apply`` is ``fn``
    (same positional arguments: value, spatial_shapes, level_start_index,
    sampling_locations, attention_weights, im2col_step)."""
    with _kept_route():
        _FUNCTION.apply = staticmethod(fn)
        yield


def switch_on_request(request: Optional[str]) -> Optional[ModuleType]:
    """``request`` as MSDA_MM_MMCV_CUDA reads: '1' the build for this GPU,
    another non-empty value (not '0') a build folder.  Switches on mmcv-lite
    with a CUDA device; returns the module, or None if nothing was switched."""
    if request in _OFF or request is None:
        return None
    if not (ext_stub.is_stubbed() and torch.cuda.is_available()):
        return None
    return use_mmcv_cuda_msda(None if request == _DEFAULT else request)


def apply_env(environ: Mapping[str, str] = os.environ) -> Optional[ModuleType]:
    """switch_on_request(environ[MSDA_MM_MMCV_CUDA]); msda_mm.compat runs it on import."""
    return switch_on_request(environ.get(ENV))
