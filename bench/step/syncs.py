"""Where a CUDA training step waits for the device, by Python frame, from
PyTorch's sync debug mode.

torch.profiler's traces can leave every one of the host's waits without a
Python frame.  ``torch.cuda.set_sync_debug_mode("warn")`` instead has every synchronising
call (``item()``, ``nonzero``, blocking copies) warn while it runs, so a
warning hook can read the Python stack at that moment. Waits in the backward
of PyTorch's own (C++) autograd nodes are buffered on the autograd engine's
thread and replayed when ``backward`` returns, so they all come out at the
frame that called it (mmengine's optimizer wrapper); those in a Python
``autograd.Function``'s backward warn at once, at that function's frames.
"""
from __future__ import annotations

import re
import traceback
import warnings
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import torch

from .profiling import NO_FRAME, TORCH_PATH

# The text of PyTorch's warning (c10/cuda/CUDAFunctions.h, warn_or_error_on_sync).
SYNC_WARNING = "called a synchronizing CUDA operation"

# Frames that only say how the wait was reached: torch's own (TORCH_PATH),
# the warnings machinery (Python 3.14 moves it to _py_warnings.py) and this
# module.
_WARNINGS_PATH = re.compile(r"(^|/)_?(py_)?warnings\.py$")
# Paths shown from the package down (".../site-packages/mmdet/x.py" -> "mmdet/x.py").
_PACKAGE_ROOT = re.compile(r"^.*/(site-packages|dist-packages)/")


def innermost_caller(stack: list[traceback.FrameSummary]) -> str:
    """The innermost frame of ``stack`` (outermost first) outside torch, as
    torch.profiler names frames: "path.py(line): function"."""
    for frame in reversed(stack):
        if (frame.filename == __file__ or TORCH_PATH.search(frame.filename)
                or _WARNINGS_PATH.search(frame.filename)):
            continue
        return f"{_PACKAGE_ROOT.sub('', frame.filename)}({frame.lineno}): {frame.name}"
    return NO_FRAME


@contextmanager
def counting_sync_warnings() -> Iterator[Counter]:
    """Counts SYNC_WARNING warnings raised inside the block by their
    innermost caller (each one: Python shows a warning once per place by
    default); other warnings go where they went before."""
    counts: Counter = Counter()
    with warnings.catch_warnings():  # restores the filters and showwarning on exit
        warnings.filterwarnings("always", message=re.escape(SYNC_WARNING))
        shown = warnings.showwarning

        def hook(message, category, filename, lineno, file=None, line=None):
            if SYNC_WARNING in str(message):
                counts[innermost_caller(traceback.extract_stack())] += 1
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = hook
        yield counts


@contextmanager
def counted_syncs(device: torch.device) -> Iterator[Counter]:
    """Inside the block, every synchronisation of ``device`` with the host
    is counted (yielded Counter: frame -> waits).  CUDA only: elsewhere the
    Counter stays empty."""
    if device.type != "cuda":
        yield Counter()
        return
    previous = torch.cuda.get_sync_debug_mode()
    with counting_sync_warnings() as counts:
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield counts
        finally:
            torch.cuda.set_sync_debug_mode(previous)
