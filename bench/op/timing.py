"""Timers for one call of a callable on CUDA (or, for smoke tests, CPU).

Every timed call starts with a cold L2: a 256 MB buffer is zeroed before it,
as ``triton.testing.do_bench`` does.  Rotating input sets instead cannot be
sized from tensor sizes: a call touches only the value rows its locations
hit (a part of the value that depends on the location distribution), so
the sets in between need not evict it from the L2 (the JSON records the
device's).  A cold start is
also what a model gives (value_proj and the layers in between sweep the
cache) and keeps one cell's numbers independent of the cell before.  The
zeroing also keeps the GPU busy while the host enqueues the timed call, so
launch latency stays out of device times.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Optional, TypeVar

import torch

T = TypeVar("T")

_FLUSH_BYTES = 256 << 20  # > 4x the L2 of any current NVIDIA GPU

# Each timer repeats for about its budget, but at least MIN_REPS times (a
# median of fewer is one outlier from noise) and at most MAX_REPS (a short
# kernel would otherwise take thousands, each behind an L2 flush).
MIN_REPS = 5
MAX_REPS = 500

_flush_buffers: dict = {}


def flush_l2(device: torch.device) -> None:
    """Evict the L2 of ``device`` (no-op on CPU)."""
    if device.type != "cuda":
        return
    if device not in _flush_buffers:
        _flush_buffers[device] = torch.empty(_FLUSH_BYTES, dtype=torch.uint8, device=device)
    _flush_buffers[device].zero_()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def flushed_and_idle(device: torch.device) -> None:
    """Evict the L2 of ``device`` and wait until it has finished all its work:
    where each timed call starts."""
    flush_l2(device)
    _synchronize(device)


def _reps(estimate_s: float, budget_ms: float) -> int:
    return int(min(MAX_REPS, max(MIN_REPS, budget_ms * 1e-3 / max(estimate_s, 1e-9))))


def capture_graph(fn: Callable[[], T]) -> tuple[torch.cuda.CUDAGraph, T]:
    """A CUDA graph of one call of ``fn``, and that call's output, which
    lives in the graph's pool: each replay writes it anew."""
    # One eager call on a side stream first, as torch.cuda.graphs requires:
    # lazy initialisation (autograd, allocator, Triton's launcher) must not be
    # captured.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = fn()
    return graph, output


def graph_times_us(fn: Callable[[], object], device: torch.device,
                   budget_ms: float) -> tuple[float, float]:
    """(cold, warm) median device time (us) of one call of ``fn``: CUDA events
    around each replay of a graph of it; cold flushes the L2 before each
    replay, warm replays back to back, so the call finds in the L2 whatever
    its previous replay left there (a decoder's value partly fits).  A graph
    has no Python dispatch or launch gaps, so this is the GPU's own time."""
    graph, _ = capture_graph(fn)

    def replays(n: int, flush: bool) -> list[float]:
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(n)]
        for start, end in pairs:
            if flush:
                flush_l2(device)
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) * 1e3 for start, end in pairs]

    estimate_us = statistics.median(replays(3, flush=True))
    reps = _reps(estimate_us * 1e-6, budget_ms)
    return (statistics.median(replays(reps, flush=True)),
            statistics.median(replays(reps, flush=False)))


def kernel_spans(fn: Callable[[], object], device: torch.device,
                 reps: int = 20) -> list[tuple[int, int, str]]:
    """(start ns, duration ns, name) of every kernel, memset and copy the CUDA
    profiler (CUPTI) records over ``reps`` calls of ``fn``, sorted by start;
    each call after one warm-up (compilation, allocator growth), an L2 flush
    (whose fill is among the spans) and a synchronisation."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    _synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flushed_and_idle(device)
            fn()
            _synchronize(device)
    return sorted((e.start_ns(), e.duration_ns(), e.name())
                  for e in prof.profiler.kineto_results.events()
                  if e.device_type() == torch.autograd.DeviceType.CUDA)


def kernel_times_us(fn: Callable[[], object], device: torch.device,
                    reps: int = 20) -> float:
    """Median device time (us) of one call of ``fn`` as the sum of its
    kernels', memsets' and copies' own durations, as the CUDA profiler
    (CUPTI) records them, cold L2 (kernel_spans).

    Unlike graph_times_us this leaves out the graph launch and the gaps
    between launches, which the event pair around a graph replay adds
    (graph_floor_us measures it).  The device
    activities split into reps groups, each led by the flush; unless every
    group holds the same activities in the same order (a call that varies,
    or no CUDA profiler), RuntimeError rather than a mixed-up figure.
    """
    spans = kernel_spans(fn, device, reps)
    size = len(spans) // reps
    groups = [spans[i * size:(i + 1) * size] for i in range(reps)]
    if not spans or len(spans) % reps or len({tuple(n for *_, n in g) for g in groups}) > 1:
        raise RuntimeError(f"{len(spans)} device activities in {reps} calls: not one group "
                           f"per call")
    # Drop each group's first activity: the flush.
    return statistics.median(sum(d for _, d, _ in g[1:]) / 1e3 for g in groups)


def graph_floor_us(device: torch.device, budget_ms: float) -> float:
    """graph_times_us (cold) of the cheapest graph there is, one one-element
    fill: what every graph-replay time includes besides the op's own work."""
    x = torch.zeros(1, device=device)
    return graph_times_us(lambda: x.fill_(1.0), device, budget_ms)[0]


def eager_times_us(fn: Callable[[], object], device: torch.device,
                   budget_ms: float) -> tuple[float, Optional[float]]:
    """(wall, host) medians in us over plain calls of ``fn``.

    wall: from the call until the device has finished it (synchronised), so
    Python dispatch, launches and device time.  host: until the call returns
    to Python, i.e. the CPU time of issuing it; each call starts on an idle,
    synchronised device, so the host never waits for the GPU.  None on CPU,
    where both are the same.
    """
    def one() -> tuple[float, float]:
        flushed_and_idle(device)
        t0 = time.perf_counter()
        result = fn()
        t1 = time.perf_counter()
        _synchronize(device)
        t2 = time.perf_counter()
        del result
        return t2 - t0, t1 - t0

    one()  # warm-up: compilation, allocator growth
    samples = [one() for _ in range(_reps(one()[0], budget_ms))]
    wall = statistics.median(s[0] for s in samples) * 1e6
    host = statistics.median(s[1] for s in samples) * 1e6
    return wall, (host if device.type == "cuda" else None)


def peak_memory_mb(device: torch.device, *steps: Callable[[], None]) -> list[float]:
    """Run ``steps`` in order; for each, the peak of allocated device memory
    during it minus what was allocated before the first step (MiB)."""
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    peaks = []
    for step in steps:
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        peaks.append((torch.cuda.max_memory_allocated(device) - base) / 2**20)
    return peaks


def autograd_floor_us(device: torch.device, budget_ms: float,
                      op: Callable[[torch.Tensor], torch.Tensor] = lambda x: x * 2
                      ) -> Optional[float]:
    """Host time (us) of the cheapest differentiable call there is, ``x * 2``
    and its autograd.grad (one kernel each way): what any eager op pays on
    this machine before doing anything, the yardstick for host_fwdbwd_us.
    ``op``: the same call written otherwise (research/host.py: as an
    autograd.Function).  None on CPU."""
    x = torch.zeros(4, 300, 256, device=device, requires_grad=True)
    grad = torch.ones_like(x)
    return eager_times_us(lambda: torch.autograd.grad(op(x), x, grad), device, budget_ms)[1]
