"""mmengine's AmpOptimWrapper with chosen submodules kept in fp32."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Sequence

from mmdet.registry import OPTIM_WRAPPERS
from mmengine.device import get_device
from mmengine.optim import AmpOptimWrapper
from torch import nn

from .fp32_modules import keep_fp32
from .submodule_paths import resolve_submodules, unwrapped


@OPTIM_WRAPPERS.register_module()
class SelectiveAmpOptimWrapper(AmpOptimWrapper):
    """``AmpOptimWrapper`` (autocast in ``dtype``, mmengine's loss scaling)
    whose forward runs the submodules ``fp32_modules`` of the model in fp32
    (see :func:`msda_mm.engine.keep_fp32`), e.g.::

        optim_wrapper = dict(type='SelectiveAmpOptimWrapper', dtype='bfloat16',
                             fp32_modules=['bbox_head'])

    Args:
        fp32_modules: dotted paths of submodules of the (unwrapped) model,
            as in ``model.named_modules()``.
        **kwargs: ``AmpOptimWrapper``'s arguments.

    The hooks are added on the first ``optim_context`` (mmengine's
    ``train_step`` enters it around the forward) and stay; with autocast off
    (validation, testing) they do nothing.

    A path that names no submodule raises ValueError when mmengine's Runner
    starts training, before the first batch is loaded: the paths are checked
    in ``initialize_count_status``, the one call by which the Runner hands
    every optim wrapper the model, whichever constructor built it (a check in
    msda_mm's constructors would miss mmengine's and others', and a hook
    would need a config line of its own).
    """

    def __init__(self, fp32_modules: Sequence[str] = (), **kwargs):
        if isinstance(fp32_modules, str) or not all(isinstance(n, str) for n in fp32_modules):
            raise TypeError(f"fp32_modules must be a list of submodule paths, got {fp32_modules!r}")
        super().__init__(**kwargs)
        self.fp32_modules = tuple(fp32_modules)
        self._hooked = None  # the model the hooks are on

    def _check_model(self, model: nn.Module) -> None:
        """Raise where ``fp32_modules`` cannot be kept in fp32 for ``model``
        (under any model wrapper): ValueError for a path that names no
        submodule, NotImplementedError for an autocast device other than
        CUDA and CPU."""
        # mmengine's autocast also runs on NPU, MLU and MUSA, where the
        # modules would silently stay in the low precision.
        if self.fp32_modules and get_device() not in ("cuda", "cpu"):
            raise NotImplementedError(
                f"SelectiveAmpOptimWrapper keeps modules in fp32 under CUDA and CPU "
                f"autocast; this runs on {get_device()}")
        resolve_submodules(unwrapped(model), self.fp32_modules, "SelectiveAmpOptimWrapper",
                           "fp32_modules")

    def initialize_count_status(self, model: nn.Module, init_counts: int,
                                max_counts: int) -> None:
        self._check_model(model)
        super().initialize_count_status(model, init_counts, max_counts)

    @contextmanager
    def optim_context(self, model: nn.Module):
        module = unwrapped(model)
        if self._hooked is not module:
            if self._hooked is not None:
                raise RuntimeError(
                    "SelectiveAmpOptimWrapper serves one model; it was given a second")
            self._check_model(module)
            keep_fp32(module, self.fp32_modules)
            self._hooked = module
        with super().optim_context(model):
            yield
