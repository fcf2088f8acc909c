"""torch.compile chosen submodules of a detector before training.

mmengine's ``compile=True`` compiles the whole model, which for DETR-like
detectors means graph breaks at every host-side step (the Hungarian
matching, the per-level reference points) and recompiles whenever they
change.  The transformer layers are where the kernel launches are (layer
norms, residual adds, the FFN, the sampling-location arithmetic): compiling
only them is the opt-in ``CompileSubmodulesHook``::

    custom_hooks = [dict(type='CompileSubmodulesHook',
                         modules=['encoder.layers', 'decoder.layers'])]

Each path names a submodule of the model (an ``nn.ModuleList`` stands for
each of its members); each is compiled in place (``nn.Module.compile``),
so parameters, state_dict keys and checkpoints are unchanged, and the
optimizer built before is still the optimizer of the same parameters.
Extra keyword arguments go to ``torch.compile`` (``dynamic``, ``mode``,
``backend``, ...).  msda_mm's op has no graph break of its own under
``torch.compile`` (its custom ops); submodules kept in fp32 by
``SelectiveAmpOptimWrapper`` break the graph at their hooks.
"""
from __future__ import annotations

from typing import Iterable, List

from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from torch import nn

from .submodule_paths import resolve_submodules, unwrapped


def compile_submodules(model: nn.Module, paths: Iterable[str], **compile_kwargs) -> List[nn.Module]:
    """Compile the submodules ``paths`` of ``model`` in place; returns them.

    Raises TypeError for a plain string and ValueError naming the model's
    children for an unknown path, before anything is compiled.
    """
    targets: List[nn.Module] = []
    for module in resolve_submodules(model, paths, "CompileSubmodulesHook", "modules"):
        targets.extend(module if isinstance(module, nn.ModuleList) else [module])
    for module in targets:
        module.compile(**compile_kwargs)
    return targets


@HOOKS.register_module()
class CompileSubmodulesHook(Hook):
    """Compiles ``modules`` (paths in the model, under any DDP wrapper) with
    ``torch.compile(**compile_kwargs)`` once, before the first training
    iteration (see the module docstring)."""

    priority = "VERY_LOW"

    def __init__(self, modules: List[str], **compile_kwargs):
        if isinstance(modules, str) or not modules:
            raise ValueError(f"CompileSubmodulesHook: modules must be a non-empty list of "
                             f"submodule paths, got {modules!r}")
        self.modules = list(modules)
        self.compile_kwargs = compile_kwargs

    def before_train(self, runner) -> None:
        compile_submodules(unwrapped(runner.model), self.modules, **self.compile_kwargs)
