"""Training steps replayed from CUDA graphs, one graph per batch shape.

A DETR training step launches thousands of small kernels, and the host
spends more time launching them than the GPU spends running them.  Here a
whole step (forward, losses, backward, gradient clipping, optimizer update)
is captured once per shape key and replayed by one launch.
"""
from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Dict, Hashable, Iterator, List, Optional, Protocol

import torch
from torch import Tensor


class StaticBatch(Protocol):
    """A batch whose ``key`` sets every shape of a step on it, and which
    ``copy_`` fills in place from another of the same key."""

    key: Hashable

    def copy_(self, other: "StaticBatch") -> "StaticBatch": ...


# Optimizers whose update can be captured (``capturable=True``) with a
# tensor learning rate.
CAPTURABLE_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW)


def check_warmup(name: str, warmup: int) -> None:
    """ValueError naming ``name`` unless at least one eager step comes
    before a capture (the optimizer's state, lazy initialisations and
    compilation must exist by then)."""
    if warmup < 1:
        raise ValueError(f"{name} must be >= 1 (the optimizer's state and lazy "
                         f"initialisations come before a capture), got {warmup}")


def check_capturable(optimizer: torch.optim.Optimizer) -> None:
    """TypeError unless ``optimizer``'s update can be captured."""
    if type(optimizer) not in CAPTURABLE_OPTIMIZERS:
        raise TypeError(f"a captured step updates the parameters by one of "
                        f"{', '.join(t.__name__ for t in CAPTURABLE_OPTIMIZERS)} "
                        f"(capturable=True); the optimizer is {type(optimizer).__name__}")


@contextmanager
def tensor_lrs(optimizer: torch.optim.Optimizer, lrs: List[Tensor]) -> Iterator[None]:
    """Each group's learning rate as its tensor of ``lrs`` while a step is
    captured, so that the graph reads the tensor; the floats that schedulers
    set are back afterwards (CapturedSteps copies them into the tensors
    before each replay)."""
    floats = [group["lr"] for group in optimizer.param_groups]
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    try:
        yield
    finally:
        for group, value in zip(optimizer.param_groups, floats):
            group["lr"] = value


class CapturedSteps:
    """Runs ``step(batch) -> Tensor`` (a whole training step, returning a
    1-D float log vector) on batches of a few shape keys.

    The first ``warmup`` batches of a key run eagerly (on a side stream on
    CUDA, as capture needs: lazy initialisations, compilation, optimizer
    state); the next one is captured into a CUDA graph whose inputs are
    that batch's tensors, then replayed; later batches of the key are
    copied into those inputs and replayed.  All graphs share one memory
    pool.  Where ``capture`` is False (a batch outside the buckets, or not
    on CUDA), the step runs eagerly.

    The optimizer is made capturable (on CUDA); its learning rates enter the
    graphs as tensors filled from the groups' floats before each replay, so
    that parameter schedulers keep working.  The log vector of a replay lives in
    the graph's memory until the next replay: read it before.

    ``setup_seconds[key]`` is the host time a captured key's first steps
    took (its eager steps, compilation included, and the capture), the
    capture's replay waited for: what a new shape costs once.
    """

    def __init__(self, step: Callable[[StaticBatch], Tensor],
                 optimizer: torch.optim.Optimizer, warmup: int = 1) -> None:
        check_warmup("warmup", warmup)
        check_capturable(optimizer)
        for group in optimizer.param_groups:
            # Before the first update, whose state (the step counts) it places.
            group["capturable"] = all(p.is_cuda for p in group["params"])
        self.step, self.optimizer, self.warmup = step, optimizer, warmup
        self._graphs: Dict[Hashable, tuple] = {}
        self._seen: Counter = Counter()
        self._pool = None
        self._lrs: Optional[List[Tensor]] = None
        self.setup_seconds: Dict[Hashable, float] = {}

    @property
    def keys(self) -> List[Hashable]:
        """The keys captured so far."""
        return list(self._graphs)

    def __call__(self, batch: StaticBatch, capture: bool) -> Tensor:
        key = batch.key
        if key in self._graphs:
            graph, inputs, log = self._graphs[key]
            inputs.copy_(batch)
            self._fill_lrs()
            graph.replay()
            return log
        if not capture:
            return self._eager(batch, side_stream=False)
        start = time.perf_counter()
        if self._seen[key] < self.warmup:
            self._seen[key] += 1
            log = self._eager(batch, side_stream=True)
        else:
            log = self._capture(batch)
            torch.cuda.synchronize()  # once per key: its setup time ends here
        self.setup_seconds[key] = self.setup_seconds.get(key, 0.0) + time.perf_counter() - start
        return log

    def _eager(self, batch: StaticBatch, side_stream: bool) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        if not side_stream:
            return self.step(batch)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            log = self.step(batch)
        torch.cuda.current_stream().wait_stream(stream)
        return log

    def _capture(self, batch: StaticBatch) -> Tensor:
        if self._lrs is None:
            device = next(p.device for g in self.optimizer.param_groups for p in g["params"])
            self._lrs = [torch.zeros((), dtype=torch.float32, device=device)
                         for _ in self.optimizer.param_groups]
        self._fill_lrs()
        # The graph's backward allocates the gradients it writes (no sum
        # into old ones): each replay writes them afresh.
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a DataLoader's pinning thread may call CUDA meanwhile.
        with tensor_lrs(self.optimizer, self._lrs), torch.cuda.graph(
                graph, pool=self._pool, capture_error_mode="thread_local"):
            log = self.step(batch)
        if self._pool is None:
            self._pool = graph.pool()
        self._graphs[batch.key] = (graph, batch, log)
        graph.replay()  # capturing ran nothing: this batch's step
        return log

    def _fill_lrs(self) -> None:
        for group, lr in zip(self.optimizer.param_groups, self._lrs):
            lr.fill_(group["lr"])
