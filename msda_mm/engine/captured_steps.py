"""Training steps replayed from CUDA graphs, one graph per batch shape.

A DETR training step launches thousands of small kernels, and the host
spends more time launching them than the GPU spends running them.  Here a
whole step (forward, losses, backward, gradient clipping, optimizer update)
is captured once per shape key and replayed by one launch, or by two where
the gradients are averaged over processes in between.
"""
from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, Iterator, List, Optional, Protocol, Tuple

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


class CaptureError(RuntimeError):
    """A training step's capture failed; the message says why where that can
    be told."""


def _alloc_retries(device: torch.device) -> int:
    return torch.cuda.memory_stats(device).get("num_alloc_retries", 0)


def capture_graph(run: Callable[[], Tensor], pool, device: torch.device,
                  key: Hashable) -> Tuple[torch.cuda.CUDAGraph, Tensor]:
    """``run`` captured into a new graph of memory pool ``pool`` (None: a
    new pool), and its output; a failed capture raises CaptureError naming
    ``key`` and, where the allocator ran out of memory meanwhile, that cause."""
    graph = torch.cuda.CUDAGraph()
    retries = _alloc_retries(device)
    try:
        # thread_local: a DataLoader's pinning thread may call CUDA meanwhile.
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            log = run()
    except RuntimeError as exc:
        # Out of memory, the allocator frees its cache, and a free ends a capture.
        retried = _alloc_retries(device) - retries
        why = (f"PyTorch's allocator ran out of GPU memory {retried} time(s) during the "
               f"capture and freed its cache, which CUDA does not allow while capturing: "
               f"free GPU memory (other processes, a smaller batch, fewer canvas sizes)"
               if retried else f"{type(exc).__name__}: {exc}")
        raise CaptureError(f"capturing the training step of shape key {key} failed: {why}. "
                           f"This process cannot capture again; start the run anew") from exc
    return graph, log


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


@dataclass
class CapturedStep:
    """The graphs of one shape key, replayed in order: one (the whole step),
    or (backward, update) with the gradients' reduction between them.

    Attributes:
        inputs: the batch the graphs read, filled in place before a replay.
        parts: each graph and the log vector it writes.
        grads: the gradients the backward graph writes (the same storage at
            every replay), which the reduction averages in place.
    """

    inputs: StaticBatch
    parts: List[Tuple[torch.cuda.CUDAGraph, Tensor]]
    grads: List[Tensor]


class CapturedSteps:
    """Runs a training step on batches of a few shape keys: ``backward(batch)
    -> Tensor`` (forward, losses, backward; a 1-D float log vector), then
    ``reduce(grads)`` where given (the gradients averaged over processes, in
    place), then ``update() -> Tensor`` (clipping and optimizer step; a 1-D
    float log vector, maybe empty).  A step returns the two log vectors
    concatenated.

    The first ``warmup`` batches of a key run eagerly (on CUDA on a side
    stream, one for all of them, as capture needs: lazy initialisations,
    compilation, optimizer state); the next one is captured, then replayed;
    later batches of the key are copied into the captured batch's tensors
    and replayed.  Without ``reduce`` the whole step is one CUDA graph; with
    it, backward and update are two, and ``reduce`` runs eagerly between
    their replays on the gradients the first writes, which are the same
    tensors at every replay (an eager collective is watched by its process
    group, which times it out when a rank stops; a captured one is not).
    All graphs share one memory pool.  Where ``capture`` is False (a batch
    outside the buckets, or not on CUDA), the step runs eagerly.

    The optimizer is made capturable (on CUDA); its learning rates enter the
    graphs as tensors filled from the groups' floats before each replay, so
    that parameter schedulers keep working.  Without ``reduce`` the log
    vector of a replay lives in the graph's memory until the next replay:
    read it before.

    ``setup_seconds[key]`` is the host time a captured key's first steps
    took (its eager steps, compilation included, and the capture), the
    capture's replay waited for: what a new shape costs once.
    """

    def __init__(self, backward: Callable[[StaticBatch], Tensor], update: Callable[[], Tensor],
                 optimizer: torch.optim.Optimizer, warmup: int = 1,
                 reduce: Optional[Callable[[List[Tensor]], None]] = None) -> None:
        check_warmup("warmup", warmup)
        check_capturable(optimizer)
        for group in optimizer.param_groups:
            # Before the first update, whose state (the step counts) it places.
            group["capturable"] = all(p.is_cuda for p in group["params"])
        self.backward, self.update, self.reduce = backward, update, reduce
        self.optimizer, self.warmup = optimizer, warmup
        self._graphs: Dict[Hashable, CapturedStep] = {}
        self._seen: Counter = Counter()
        self._pool = None
        self._lrs: Optional[List[Tensor]] = None
        # One side stream for every warm-up step: the allocator caches blocks
        # per stream, so a new stream a step would hold a step's memory each.
        self._side_stream: Optional[torch.cuda.Stream] = None
        self.setup_seconds: Dict[Hashable, float] = {}

    @property
    def keys(self) -> List[Hashable]:
        """The keys captured so far."""
        return list(self._graphs)

    def __call__(self, batch: StaticBatch, capture: bool) -> Tensor:
        key = batch.key
        if key in self._graphs:
            captured = self._graphs[key]
            captured.inputs.copy_(batch)
            return self._replay(captured)
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

    def eager(self, batch: StaticBatch) -> Tensor:
        """The step on ``batch`` run eagerly, whatever its key: what a
        replay of it is checked against."""
        return self._eager(batch, side_stream=False)

    def grads(self) -> List[Tensor]:
        """The optimizer's parameters' gradients, in its groups' order (the
        same on every rank), those without one left out."""
        return [p.grad for group in self.optimizer.param_groups for p in group["params"]
                if p.grad is not None]

    def _step(self, batch: StaticBatch) -> Tensor:
        log = self.backward(batch)
        if self.reduce is not None:
            self.reduce(self.grads())
        return torch.cat([log, self.update()])

    def _eager(self, batch: StaticBatch, side_stream: bool) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        if not side_stream:
            return self._step(batch)
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream()
        stream = self._side_stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            log = self._step(batch)
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
        with tensor_lrs(self.optimizer, self._lrs):
            if self.reduce is None:
                parts = [self._graph(lambda: self._step(batch), batch.key)]
                grads = []
            else:
                parts = [self._graph(lambda: self.backward(batch), batch.key)]
                # Held here: the pool keeps their memory for this key's graphs.
                grads = self.grads()
                parts.append(self._graph(self.update, batch.key))
        captured = CapturedStep(inputs=batch, parts=parts, grads=grads)
        self._graphs[batch.key] = captured
        return self._replay(captured)  # capturing ran nothing: this batch's step

    def _graph(self, run: Callable[[], Tensor],
               key: Hashable) -> Tuple[torch.cuda.CUDAGraph, Tensor]:
        """``run`` captured into a graph of the shared pool, and its output."""
        graph, log = capture_graph(run, self._pool, self._lrs[0].device, key)
        if self._pool is None:
            self._pool = graph.pool()
        return graph, log

    def _replay(self, captured: CapturedStep) -> Tensor:
        self._fill_lrs()
        graph, log = captured.parts[0]
        graph.replay()
        if len(captured.parts) == 1:
            return log
        self.reduce(captured.grads)
        graph, update_log = captured.parts[1]
        graph.replay()
        return torch.cat([log, update_log])

    def _fill_lrs(self) -> None:
        for group, lr in zip(self.optimizer.param_groups, self._lrs):
            lr.fill_(group["lr"])
