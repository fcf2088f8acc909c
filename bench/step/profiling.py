"""What a ``torch.profiler`` trace of training steps says about one step:
device-busy time, the MSDA kernels' share of it, the device's most expensive
kernels, the host's most expensive
ops and Python functions, and its synchronisation points.

The steps are marked with ``record_function(STEP)``.  Host events count when
they start inside a marked step, on the step's thread or on any other that
runs ops then (CUDA runs the backward on the autograd engine's own thread,
which the Python stack of the step does not contain).  Device events count
whole: the profiled window holds nothing but the steps.
"""
from __future__ import annotations

import bisect
import re
from collections import defaultdict

from torch.autograd import DeviceType

STEP = "msda_mm::train_step"

# Kernels of msda_mm (msda_fwd_kernel, msda_fwd_pairs_kernel, msda_bwd_kernel)
# and of mmcv (ms_deformable_im2col_gpu_kernel, ...).
MSDA_KERNEL = re.compile(r"msda_(fwd|bwd)\w*_kernel|ms_deform", re.IGNORECASE)

# Host events that wait for the device, or stand for such a wait on CUDA
# (counted on the CPU too: each is a stall once the model runs on a GPU).
_CUDA_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
               "cudaMemcpy")
# The ops that wait: one event per synchronisation, on the Python thread.
_WAITING_OPS = ("aten::_local_scalar_dense", "aten::nonzero")
SYNC_EVENTS = ("aten::_local_scalar_dense", "aten::item", "aten::nonzero") + _CUDA_WAITS

TOP_HOST = 15
TOP_DEVICE = 15
TOP_SYNC_SOURCES = 12

# A Python frame as torch.profiler(with_stack=True) names it: "path.py(line): function".
_FRAME = re.compile(r"^(?P<path>[^<]*\.py)\(\d+\): ")
# A path inside torch: its frames only say which tensor method synchronised.
TORCH_PATH = re.compile(r"(^|/)torch/")
# What a wait with no such frame is counted under.
NO_FRAME = "(no Python frame)"

# Python events name their callable with its address ("<built-in method sum
# of Tensor object at 0x7f...>"): dropped, so each callable is one row.
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _host_events_in_steps(events) -> tuple[list, list]:
    """(the host events of the threads that work for the steps, the Python
    frames of any thread) that start inside a marked step."""
    marks = [e for e in events if e.name == STEP and e.device_type == DeviceType.CPU]
    if not marks:
        raise ValueError(f"no {STEP!r} range in the trace: mark each step with "
                         f"torch.profiler.record_function({STEP!r})")
    steps = sorted((e.time_range.start, e.time_range.end) for e in marks)
    starts = [start for start, _ in steps]

    def in_a_step(t):
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and t <= steps[i][1]

    inside = [e for e in events
              if e.device_type == DeviceType.CPU and not e.is_async and e.name != STEP
              and in_a_step(e.time_range.start)]
    # The threads that work for the step: the one running it and those that
    # run its ops (autograd's).  Others, e.g. a data loader's queue feeder
    # blocked on a lock, only idle alongside it.
    working = {e.thread for e in marks} | {e.thread for e in inside if e.name.startswith("aten::")}
    return [e for e in inside if e.thread in working], [e for e in inside if _caller(e.name)]


def _device_summary(events, iters: int) -> dict:
    # Device events are kernels, copies and fills, plus a device-side copy of
    # every record_function range (the step itself, Optimizer.step, ...):
    # those carry the name of a host event and are left out.  Busy time is
    # the union of the rest, so overlapping streams count once.
    host_names = {e.name for e in events if e.device_type == DeviceType.CPU}
    kernels = [e for e in events
               if e.device_type != DeviceType.CPU and e.name not in host_names]
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    msda = sum(e.time_range.elapsed_us() for e in kernels if MSDA_KERNEL.search(e.name))
    busy, end = 0.0, float("-inf")
    for start, stop in spans:
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    if busy == 0.0:
        return dict(device_ms_per_iter=None, msda_ms_per_iter=None, msda_share=None,
                    device_top=[])
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in kernels:
        row = by_name[e.name]
        row[0] += 1
        row[1] += e.time_range.elapsed_us()
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:TOP_DEVICE]
    return dict(device_ms_per_iter=busy / iters / 1e3, msda_ms_per_iter=msda / iters / 1e3,
                msda_share=msda / busy,
                # Kernel time summed per name (streams that overlap count twice).
                device_top=[dict(name=name, calls_per_iter=calls / iters,
                                 ms_per_iter=us / iters / 1e3, share_of_busy=us / busy)
                            for name, (calls, us) in top])


def _caller(frame_name: str) -> bool:
    # A frame of the model's code (mmdet, mmengine, msda_mm, scipy, ...):
    # torch's own frames only say which tensor method synchronised.
    match = _FRAME.match(frame_name)
    return bool(match) and not TORCH_PATH.search(match["path"])


def _sync_sources(host, python_frames) -> list:
    """[(innermost non-torch Python frame, synchronisations)] over the
    ``host`` events, most first.  Python frames nest on their thread, so the
    innermost one around an event is the latest-starting frame that has not
    ended by then.  The frames of a waiting op's own thread are searched; if
    that thread has none, those of the thread with the most frames (the main
    Python thread): the profiler can give the Python frames another thread
    id than the ops."""
    frames = defaultdict(list)
    for e in python_frames:
        frames[e.thread].append((e.time_range.start, e.time_range.end, e.name))
    for spans in frames.values():
        spans.sort()
    main = max(frames.values(), key=len, default=[])
    # One event per synchronisation: the ops that wait on CUDA, which run on
    # the Python thread.  Not the CUDA runtime's own waits, which the
    # profiler can give yet another thread id.  Waits inside other ops
    # (.cpu(), .tolist(), explicit synchronize) count among sync_points but
    # are attributed to no frame.
    counts: dict[str, int] = defaultdict(int)
    for e in host:
        if e.name not in _WAITING_OPS:
            continue
        # Only a thread with no frames at all falls back to the main one: a
        # wait on a thread with frames but none around it stays frameless.
        spans, start = frames.get(e.thread) or main, e.time_range.start
        i = bisect.bisect_right(spans, (start, float("inf"))) - 1
        while i >= 0 and spans[i][1] < e.time_range.end:
            i -= 1
        counts[spans[i][2] if i >= 0 else NO_FRAME] += 1
    return sorted(counts.items(), key=lambda kv: -kv[1])


def summarise(events, iters: int) -> dict:
    """Per-step figures from the events (``prof.events()``) of ``iters``
    marked steps.  Device figures are None when no device event was traced
    (a CPU run)."""
    host, python_frames = _host_events_in_steps(events)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in host:
        row = by_name[_ADDRESS.sub("", e.name)]
        row[0] += 1
        row[1] += e.self_cpu_time_total
    host_us = sum(us for _, us in by_name.values())
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:TOP_HOST]
    return dict(
        _device_summary(events, iters),
        cpu_ms_per_iter=host_us / iters / 1e3,
        host_top=[dict(name=name, calls_per_iter=calls / iters,
                       self_cpu_ms_per_iter=us / iters / 1e3,
                       share_of_host=us / host_us if host_us else 0.0)
                  for name, (calls, us) in top],
        sync_points_per_iter={name: by_name[name][0] / iters if name in by_name else 0.0
                              for name in SYNC_EVENTS},
        sync_sources_per_iter=[dict(frame=frame, per_iter=n / iters)
                               for frame, n in _sync_sources(host, python_frames)
                               [:TOP_SYNC_SOURCES]])
