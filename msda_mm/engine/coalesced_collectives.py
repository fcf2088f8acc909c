"""Collectives over many tensors in a few flat buckets: one collective per
bucket instead of one per tensor (a DETR has hundreds of parameters, and
each collective costs a launch and a latency of its own).
"""
from __future__ import annotations

from typing import Callable, Iterator, List, Sequence

import torch
import torch.distributed as dist
from torch import Tensor


def buckets(tensors: Sequence[Tensor], cap_bytes: int) -> Iterator[List[Tensor]]:
    """``tensors`` in order, cut into runs of one dtype and device of at
    most ``cap_bytes`` each (a tensor larger than that is a run of its own)."""
    run: List[Tensor] = []
    size = 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if run and (size + nbytes > cap_bytes or tensor.dtype != run[0].dtype
                    or tensor.device != run[0].device):
            yield run
            run, size = [], 0
        run.append(tensor)
        size += nbytes
    if run:
        yield run


@torch.no_grad()  # parameters too: their values change, not their graphs
def coalesced(tensors: Sequence[Tensor], collective: Callable[[Tensor], None],
              cap_bytes: int) -> None:
    """``collective`` (in place on a 1-D tensor) applied to ``tensors``
    through flat copies of ``buckets``, the results copied back."""
    for run in buckets(tensors, cap_bytes):
        flat = torch.cat([tensor.reshape(-1) for tensor in run])
        collective(flat)
        for tensor, part in zip(run, flat.split([tensor.numel() for tensor in run])):
            tensor.copy_(part.view_as(tensor))


def check_bucket_cap(bucket_cap_mb: float) -> int:
    """``bucket_cap_mb`` MiB in bytes; ValueError unless positive."""
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb!r}")
    return int(bucket_cap_mb * 2 ** 20)


def broadcast_from_rank0(tensors: Sequence[Tensor], bucket_cap_mb: float = 250) -> None:
    """Every rank's ``tensors`` set to rank 0's, in place (the same list of
    shapes on every rank)."""
    cap = check_bucket_cap(bucket_cap_mb)
    coalesced(tensors, lambda flat: dist.broadcast(flat, src=0), cap)


class GradientAllReduce:
    """Averages gradients over the ranks of the default process group, in
    place, coalesced into buckets of ``bucket_cap_mb`` MiB: the average
    DistributedDataParallel makes during backward, made here after it by
    the training step itself.

    Every rank must pass gradients of the same shapes in the same order
    (the same parameters with a gradient), as under DistributedDataParallel
    without ``find_unused_parameters``.
    """

    def __init__(self, bucket_cap_mb: float = 25) -> None:
        self.cap_bytes = check_bucket_cap(bucket_cap_mb)
        self.world_size = dist.get_world_size()

    def __call__(self, grads: Sequence[Tensor]) -> None:
        # Divided before the sum, as DistributedDataParallel divides: exact
        # for a power-of-two world size, and no overflow of the sum.
        coalesced(grads, lambda flat: dist.all_reduce(flat.div_(self.world_size)),
                  self.cap_bytes)
