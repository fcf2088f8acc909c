"""An optimizer constructor that gives equal parameter groups one group.

mmengine's ``DefaultOptimWrapperConstructor`` puts every parameter in a
group of its own as soon as a config has a ``paramwise_cfg`` (mmdet's DINO
and Deformable DETR configs do: the backbone's ``lr_mult=0.1``).  PyTorch's
optimizers then step group by group: the fused AdamW launches its kernels
once per group, each after a Python pass over the group.  On the H200 box
that was 45 ms of host time a step (``Optimizer.step#AdamW.step``, self CPU,
DINO R50 at batch 8, ``tools/profile_step.py``), on a step that waits on
the host.  ``MergedGroupsOptimWrapperConstructor`` builds the same groups,
then merges those whose options (lr, weight decay, ...) are all equal, in
the order they first appear: every parameter keeps exactly its options.

Opt in from a config::

    optim_wrapper = dict(constructor='MergedGroupsOptimWrapperConstructor')

An optimizer state saved with the default constructor has another group
layout: resume such a checkpoint with the constructor it was saved with.
"""
from __future__ import annotations

from typing import List

from mmdet.registry import OPTIM_WRAPPER_CONSTRUCTORS
from mmengine.optim import DefaultOptimWrapperConstructor
from torch import nn


def merge_param_groups(groups: List[dict]) -> List[dict]:
    """Groups with equal options merged, in first-appearance order; each
    group's parameters keep their order.  Options are compared with ``==``
    (a config may give lists, e.g. ``betas``).  A parameter in two groups
    (a shared one, without ``bypass_duplicate``) raises ValueError as
    PyTorch does for separate groups: within one merged group it would only
    warn, and step the parameter twice."""
    merged: List[tuple] = []  # (options, group)
    seen = set()
    for group in groups:
        for p in group["params"]:
            if id(p) in seen:
                raise ValueError("MergedGroupsOptimWrapperConstructor: a parameter appears in "
                                 "more than one parameter group (shared between modules?); "
                                 "set paramwise_cfg.bypass_duplicate=True")
            seen.add(id(p))
        options = {k: v for k, v in group.items() if k != "params"}
        target = next((g for o, g in merged if o == options), None)
        if target is None:
            target = {**options, "params": []}
            merged.append((options, target))
        target["params"].extend(group["params"])
    return [group for _, group in merged]


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class MergedGroupsOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """``DefaultOptimWrapperConstructor`` whose per-parameter groups are
    merged where their options are equal (see the module docstring)."""

    def add_params(self, params: List[dict], module: nn.Module, prefix: str = "",
                   is_dcn_module=None) -> None:
        super().add_params(params, module, prefix, is_dcn_module)
        if not prefix:  # the outermost call: every submodule's groups are in
            params[:] = merge_param_groups(params)
