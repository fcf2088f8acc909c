"""``GraphedDataParallel``: data parallelism for a model whose training step
is its own (``GraphedDINO``'s, replayed from CUDA graphs).

mmengine's MMDistributedDataParallel runs the model's ``loss`` under torch's
DistributedDataParallel, whose autograd hooks all-reduce the gradients
during backward: that bypasses the model's ``train_step``, and the hooks'
collectives would land inside a captured backward.  This wrapper leaves the
step to the model and hands it the gradients' all-reduce, which the step
runs after backward and before clipping (so the clipped norm is the global
one, as under DDP)::

    model_wrapper_cfg = dict(type='GraphedDataParallel')

mmengine wraps the model only in a distributed launch; on one process the
key is ignored, so a config can always carry it.
"""
from __future__ import annotations

import inspect
from typing import Dict, List, Union

import torch.distributed as dist
from mmdet.registry import MODEL_WRAPPERS
from mmengine.optim import OptimWrapper
from torch import nn

from .coalesced_collectives import GradientAllReduce, broadcast_from_rank0


@MODEL_WRAPPERS.register_module()
class GraphedDataParallel(nn.Module):
    """Wraps ``module`` (its ``train_step`` taking ``grad_reducer``) for
    training on every rank of the default process group: rank 0's
    parameters and buffers are broadcast at construction, and
    ``train_step`` passes a ``GradientAllReduce`` of ``bucket_cap_mb`` MiB
    buckets to the module's.  ``val_step``, ``test_step`` and ``forward``
    are the module's (no gradient is averaged there).

    Args:
        module: the model, e.g. GraphedDINO.
        bucket_cap_mb: the size of the all-reduce's flat buckets, as
            DistributedDataParallel's ``bucket_cap_mb``.
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25) -> None:
        super().__init__()
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("GraphedDataParallel needs the default process group "
                               "(a distributed launch); none is initialised")
        train_step = getattr(module, "train_step", None)
        if train_step is None or "grad_reducer" not in inspect.signature(train_step).parameters:
            raise TypeError(f"GraphedDataParallel wraps a model whose train_step takes "
                            f"grad_reducer (GraphedDINO); module is {type(module).__name__}")
        self.module = module
        self.grad_reducer = GradientAllReduce(bucket_cap_mb)
        broadcast_from_rank0([*module.parameters(), *module.buffers()])

    def train_step(self, data: Union[dict, tuple, list],
                   optim_wrapper: OptimWrapper) -> Dict[str, float]:
        """The module's ``train_step``, its gradients averaged over the ranks."""
        return self.module.train_step(data, optim_wrapper, grad_reducer=self.grad_reducer)

    def val_step(self, data: Union[dict, tuple, list]) -> List:
        return self.module.val_step(data)

    def test_step(self, data: Union[dict, tuple, list]) -> List:
        return self.module.test_step(data)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)
