"""Where the host time of one eager MSDA forward + backward goes.

The benchmark's ``host_fwdbwd_us`` is one number (660-990 us on the H200
box, whose cheapest differentiable op, ``x * 2`` and its grad, already
costs 205 us).  These pieces split it: the op through autograd, the two
allocating launchers called directly, the same launchers launching through
Triton's own ``JITFunction.run`` instead of FastLaunch (FastLaunch's saving
is the difference) and with their Triton launches replaced by nothing (the
launches' own cost is the difference), the input checks, the grad_value
fill and one bare allocation; the op with its backward on the calling
thread (a CUDA backward runs on autograd's device thread by default); on
CUDA also the floor, and the floor's op written as an autograd.Function (a
Python backward, as the op's).  Each is the median CPU time until the call
returns, on an idle device, timed as ``eager_times_us`` times (on CPU,
where nothing is asynchronous, the wall time).
"""
from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import statistics
import time
from typing import Callable, Optional
from unittest import mock

import torch

from bench.op.impls import bind
from bench.op.inputs import MSDAInputs
from bench.op.timing import autograd_floor_us, eager_times_us
from msda_mm.ops import multi_scale_deformable_attention, resolve_fp32_grad_accum
from msda_mm.ops.backward import launcher as backward_launcher
from msda_mm.ops.backward import zero_fill
from msda_mm.ops.deterministic import buckets, grad_value
from msda_mm.ops.fast_launch import FastLaunch
from msda_mm.ops.forward import launcher as forward_launcher
from msda_mm.ops.validate import check_inputs
from research.scatter import zeroed

# The launchers' kernels, as (module, name) of each FastLaunch they launch.
_KERNELS = tuple((module, name)
                 for module in (forward_launcher, backward_launcher, zero_fill, buckets,
                                grad_value)
                 for name, obj in vars(module).items() if isinstance(obj, FastLaunch))
# Pieces named so are timed inside no_launches() / ordinary_launches()
# (entered once around the timing, so that patching costs nothing per call).
NO_LAUNCH = ", no launch"
ORDINARY_LAUNCH = ", Triton's own launch path"


class _TimesTwo(torch.autograd.Function):
    """``x * 2`` with its backward in Python: autograd_floor_us's op as an
    autograd.Function, as msda_mm's op is one (its backward node runs
    Python on autograd's device thread, where a CUDA backward runs)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](*args, **meta)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **meta: None


@contextlib.contextmanager
def _kernels_replaced(replacement: Callable[[FastLaunch], object]):
    """Inside this block each launcher's kernel is ``replacement(kernel)``."""
    with contextlib.ExitStack() as stack:
        for module, name in _KERNELS:
            stack.enter_context(mock.patch.object(module, name,
                                                  replacement(getattr(module, name))))
        yield


def no_launches():
    """Inside this block the launchers' kernels launch nothing (outputs stay
    uninitialised): what the launchers cost without Triton's launch."""
    return _kernels_replaced(lambda kernel: NoLaunch())


def ordinary_launches():
    """Inside this block the launchers launch their kernels through Triton's
    ``JITFunction.run`` every time instead of FastLaunch's kept compiled
    kernels: FastLaunch's saving is the difference."""
    return _kernels_replaced(lambda kernel: kernel.fn)


_PATCHES = {NO_LAUNCH: no_launches, ORDINARY_LAUNCH: ordinary_launches}


def pieces(inputs: MSDAInputs) -> dict[str, Callable[[], object]]:
    """{name: call} of every piece, in the order of the table (those named
    ``... + NO_LAUNCH`` to be called inside no_launches(), ``... +
    ORDINARY_LAUNCH`` inside ordinary_launches())."""
    x = inputs
    value, loc, attn = (t.detach().requires_grad_() for t in
                        (x.value, x.sampling_locations, x.attention_weights))
    accum = resolve_fp32_grad_accum(x.value, None)

    def op():
        return multi_scale_deformable_attention(value, x.spatial_shapes, x.level_start_index,
                                                loc, attn)

    def forward():
        return forward_launcher.launch_forward(x.value, x.spatial_shapes,
                                               x.sampling_locations, x.attention_weights)

    def op_grad():
        return torch.autograd.grad(op(), (value, loc, attn), x.grad_output)

    def op_grad_on_caller_thread():
        with torch.autograd.set_multithreading_enabled(False):
            return op_grad()

    def backward():
        return backward_launcher.launch_backward(x.grad_output, x.value, x.spatial_shapes,
                                                 x.sampling_locations,
                                                 x.attention_weights, accum)

    return {
        "op forward": op,
        "op forward + autograd.grad": op_grad,
        "op forward + autograd.grad, backward on the calling thread": op_grad_on_caller_thread,
        "launch_forward": forward,
        "launch_forward" + ORDINARY_LAUNCH: forward,
        "launch_forward" + NO_LAUNCH: forward,
        "launch_backward": backward,
        "launch_backward" + ORDINARY_LAUNCH: backward,
        "launch_backward" + NO_LAUNCH: backward,
        "check_inputs": lambda: check_inputs(value, x.spatial_shapes, x.level_start_index,
                                             loc, attn),
        "zeroed (grad_value)": lambda: zeroed(
            x.value.shape, torch.float32 if accum else x.value.dtype, x.value.device),
        "torch.empty (1 element)": lambda: torch.empty(1, device=x.value.device),
    }


def host_breakdown(inputs: MSDAInputs, calls: dict[str, Callable[[], object]],
                   budget_ms: float) -> dict[str, float]:
    """{piece: host us} of ``calls`` (``pieces(inputs)``), plus the autograd
    floor of this machine."""
    device = inputs.value.device
    times = {}
    for name, fn in calls.items():
        patch = next((ctx for suffix, ctx in _PATCHES.items() if name.endswith(suffix)),
                     contextlib.nullcontext)
        with patch():
            wall, host = eager_times_us(fn, device, budget_ms)
        times[name] = wall if host is None else host
    floor = autograd_floor_us(device, budget_ms)
    if floor is not None:
        times["floor: x * 2 + autograd.grad"] = floor
        # What a Python backward adds to any eager op.
        times["floor, backward in Python"] = autograd_floor_us(device, budget_ms,
                                                               _TimesTwo.apply)
    return times


def profile(fn: Callable[[], object], calls: int, top: int) -> str:
    """pstats text of ``calls`` calls of ``fn``, by own time."""
    fn()  # compiled and allocated before the profile
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def forward_backward(impl: str, inputs: MSDAInputs) -> Callable[[], tuple]:
    """One eager forward + torch.autograd.grad of ``impl`` (its gradients for
    value, sampling_locations and attention_weights), as bench/op/cell.py
    times host_fwdbwd_us."""
    fn = bind(impl, inputs)
    args = tuple(t.detach().requires_grad_() for t in
                 (inputs.value, inputs.sampling_locations, inputs.attention_weights))
    return lambda: torch.autograd.grad(fn(*args), args, inputs.grad_output)


def alternating_times_us(calls: dict[str, Callable[[], object]], reps: int,
                         warmup: int = 20, clock: Callable[[], float] = time.thread_time,
                         before: Optional[Callable[[], None]] = None
                         ) -> dict[str, list[float]]:
    """{name: us of each call} over ``reps`` rounds of one call of each of
    ``calls``, the order reversed every other round (so that none always runs
    right after another).  ``clock``: by default the CPU time of the calling
    thread; ``before``: run ahead of each call, outside the timing (say a
    device synchronisation, so that each call starts on an idle device)."""
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls)
    for rep in range(reps):
        for name in (order if rep % 2 == 0 else order[::-1]):
            if before is not None:
                before()
            start = clock()
            calls[name]()
            times[name].append((clock() - start) * 1e6)
    return times


def tenth(times: list[float]) -> float:
    """The 10th percentile: on a shared CPU, the calls least slowed by the
    other processes' use of its caches."""
    return sorted(times)[len(times) // 10]


def paired_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a's time over b's in the same round: the
    machine's drift (other processes, clock) cancels out of each round."""
    return statistics.median(x / y for x, y in zip(a, b))
