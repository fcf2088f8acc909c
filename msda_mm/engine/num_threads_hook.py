"""``NumThreadsHook``: a run on a fixed number of intra-op CPU threads.

PyTorch takes one thread per core by default, and a CPU reduction split
over threads sums in an order that depends on their number, so one seed
gives another model on a machine with another core count.  Measured with
the CPU demo (configs/synthetic/dino_tiny_cpu.py, 300 iterations from seed
0; 2026-12-01, a 2-core box, torch 2.13.0, mmdet 3.3.0, commit 4ab18a2):
two threads printed AP 0.049 in both of two runs, one thread 0.043.  On
that box busy with other jobs, two threads also took 58 minutes (load
average 6 to 10; 7.7 when it was lighter), one thread 5.5 (load 3 to 5):
each multi-threaded op waits at OpenMP's barriers for its slowest thread.
``torch.set_num_threads`` is applied before the run (so before the weights
are initialised) and undone after it::

    custom_hooks = [dict(type='NumThreadsHook', num_threads=1)]
"""
from __future__ import annotations

from numbers import Integral

import torch
from mmdet.registry import HOOKS
from mmengine.hooks import Hook


@HOOKS.register_module()
class NumThreadsHook(Hook):
    """Sets ``torch.set_num_threads(num_threads)`` from before_run to
    after_run (train, val or test), restoring the count it found."""

    priority = "VERY_HIGH"

    def __init__(self, num_threads: int):
        if isinstance(num_threads, bool) or not isinstance(num_threads, Integral):
            raise TypeError(f"NumThreadsHook: num_threads must be an int, got {num_threads!r}")
        if num_threads < 1:
            raise ValueError(f"NumThreadsHook: num_threads must be at least 1, got {num_threads}")
        self.num_threads = int(num_threads)
        self._found: int | None = None

    def before_run(self, runner) -> None:
        self._found = torch.get_num_threads()
        torch.set_num_threads(self.num_threads)

    def after_run(self, runner) -> None:
        if self._found is not None:
            torch.set_num_threads(self._found)
            self._found = None
