"""Run chosen submodules of a model in fp32 while the rest runs under autocast.

``keep_fp32(model, ["bbox_head"])`` adds a forward pre-hook (ahead of any
other) and an always-called forward hook to every module at or under each
named submodule.  When such a module is called with autocast on (and no
enclosing fp32 module has already turned it off), the pre-hook casts the
fp16 and bf16 tensors among its arguments (nested in lists, tuples and
dicts too) to fp32 and turns autocast off for the devices where it was on;
the forward hook turns it back on, also when the forward raises.  With
autocast off (fp32 training, evaluation) the hooks do nothing.  Parameters,
buffers and state_dict keys are untouched, and the hooks survive
``copy.deepcopy`` (EMA copies) since they hold no reference to a module.
CUDA and CPU autocast only.  Under ``torch.compile`` each kept module is a
graph break (Dynamo does not trace the hooks' autocast contexts).
"""
from __future__ import annotations

from typing import Iterable, List

import torch
from torch import nn
from torch.utils._pytree import tree_map
from torch.utils.hooks import RemovableHandle

from .submodule_paths import resolve_submodules

# The autocast devices the hooks turn off (mmengine's autocast also runs on
# NPU, MLU and MUSA, which SelectiveAmpOptimWrapper refuses).
_DEVICE_TYPES = ("cuda", "cpu")


# What autocast casts down to; fp64 it leaves alone, and so do the hooks.
_HALF_TYPES = (torch.float16, torch.bfloat16)


def _to_fp32(x):
    if isinstance(x, torch.Tensor) and x.dtype in _HALF_TYPES:
        return x.float()
    return x


class _Fp32Region:
    """The pre-hook and forward hook of one module.  ``_open`` holds, per
    call in progress, the autocast contexts that its pre-hook entered (empty
    where autocast was already off), exited by the forward hook in reverse
    order."""

    def __init__(self):
        self._open: List[List[torch.autocast]] = []

    def before(self, module, args, kwargs):
        devices = [d for d in _DEVICE_TYPES if torch.is_autocast_enabled(d)]
        contexts = [torch.autocast(d, enabled=False) for d in devices]
        for context in contexts:
            context.__enter__()
        self._open.append(contexts)
        if contexts:
            return tree_map(_to_fp32, args), tree_map(_to_fp32, kwargs)
        return None

    def after(self, module, args, output):
        # Empty only where the pre-hook did not run: a global pre-hook (which
        # runs ahead of it) raised.
        if self._open:
            for context in reversed(self._open.pop()):
                context.__exit__(None, None, None)
        return None


def keep_fp32(model: nn.Module, names: Iterable[str]) -> List[RemovableHandle]:
    """Make the submodules ``names`` of ``model`` (dotted paths, as in
    ``model.named_modules()``) and everything under them run in fp32 under
    autocast.

    Returns the hooks' handles (``handle.remove()`` undoes it).  Raises
    ``ValueError`` naming the path when ``model`` has no such submodule, or
    ``TypeError`` when ``names`` is a plain string.
    """
    handles: List[RemovableHandle] = []
    hooked = set()
    for root in resolve_submodules(model, names, "keep_fp32", "names"):
        for module in root.modules():
            if id(module) in hooked:
                continue
            hooked.add(id(module))
            region = _Fp32Region()
            # First among the module's pre-hooks: one that raised ahead of it
            # would leave the forward hook's call unpaired.
            handles.append(module.register_forward_pre_hook(region.before, with_kwargs=True,
                                                            prepend=True))
            handles.append(module.register_forward_hook(region.after, always_call=True))
    return handles
