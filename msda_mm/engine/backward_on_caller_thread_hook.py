"""Run each training step's backward on the training loop's own thread.

PyTorch runs a CUDA backward on a worker thread of its autograd engine, one
per device, while the thread that called ``backward()`` waits.  Python
backward nodes (msda_mm's op is an ``autograd.Function`` in eager mode; a
compiled region's backward is one too) then run their Python on that worker.
On the H200 box this cost about twice the host time of the same Python on
the calling thread: msda_mm's decoder backward launcher took 460-503 us
inside a backward node against 187-221 us with the backward on the calling
thread, and the op's forward + backward 598-740 against 290-301 us
(benchmarks/nvidia-h200-host-thread-s10.log).  A plain Python thread did
not pay it (189-241 us).

``torch.autograd.set_multithreading_enabled(False)`` (thread-local) makes
the engine run the backward on the calling thread; this hook sets it for
the thread that runs the training loop, before training, and restores it
after.  The calling thread waits for the backward either way, so no work
that ran in parallel is serialised; with one device per process
(mmengine's launcher, DDP included) the same kernels are queued in the same
order.  Opt-in::

    custom_hooks = [dict(type='BackwardOnCallerThreadHook')]
"""
from __future__ import annotations

import torch
from mmdet.registry import HOOKS
from mmengine.hooks import Hook


@HOOKS.register_module()
class BackwardOnCallerThreadHook(Hook):
    """Backward on the training loop's thread from before_train to after_train."""

    priority = "VERY_HIGH"

    def __init__(self):
        self._saved = None

    def before_train(self, runner) -> None:
        self._saved = torch.autograd.set_multithreading_enabled(False)

    def after_train(self, runner) -> None:
        if self._saved is not None:
            self._saved.__exit__(None, None, None)  # restores the previous mode
            self._saved = None
