"""Submodules of a model named by dotted paths, as configs name them, and
the model under mmengine's wrappers (DDP), whose paths they are."""
from __future__ import annotations

import difflib
from typing import Iterable, List

from mmengine.model import is_model_wrapper
from torch import nn


def unwrapped(model: nn.Module) -> nn.Module:
    """The model inside an mmengine model wrapper (DDP, ...), else itself."""
    return model.module if is_model_wrapper(model) else model


def resolve_submodules(model: nn.Module, paths: Iterable[str], owner: str,
                       argument: str) -> List[nn.Module]:
    """``model.get_submodule(path)`` for each path, all resolved before any
    is used.  TypeError when ``paths`` is a plain string (a list of its
    characters is never meant); ValueError naming ``owner``, ``argument``,
    the path, the model's children and the closest submodule paths for a
    path that names no submodule (a typo, or a parameter's path)."""
    if isinstance(paths, str):
        raise TypeError(f"{argument} must be a list of submodule paths, got the string {paths!r}")
    modules = []
    for path in paths:
        try:
            modules.append(model.get_submodule(path))
        except AttributeError:
            children = sorted(name for name, _ in model.named_children())
            close = difflib.get_close_matches(path, [name for name, _ in model.named_modules()
                                                     if name])
            raise ValueError(f"{owner}: {argument}: {type(model).__name__} has no submodule "
                             f"{path!r} (its children: {children})"
                             + (f"; close matches: {close}" if close else "")) from None
    return modules
