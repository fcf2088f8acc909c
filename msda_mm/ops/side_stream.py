"""A second stream per CUDA device, for work that needs none of the kernel
the current stream runs next: the deterministic backward's stable sort
(launch.stable_bucket_records) runs beside msda_bwd_kernel this way.

fork() makes the side stream wait for everything queued on the current
stream so far, join() the current stream wait for everything queued on the
side stream.  Every use of the side stream starts with a fork, so memory
that the side stream allocated and the current stream last read is reused
on the side stream only after that read.  Both take part in CUDA-graph
capture like any forked stream.  Off CUDA (the interpreter) both do nothing.
"""
from __future__ import annotations

import contextlib

import torch

_SIDE: dict[int, torch.cuda.Stream] = {}


def fork(device: torch.device) -> torch.cuda.Stream | None:
    """The device's side stream, made to wait for the current stream's work
    queued so far; None off CUDA."""
    if device.type != "cuda":
        return None
    main = torch.cuda.current_stream(device)
    side = _SIDE.get(main.device_index)
    if side is None:
        side = _SIDE[main.device_index] = torch.cuda.Stream(main.device)
    side.wait_stream(main)
    return side


def on(side: torch.cuda.Stream | None):
    """A context that queues work (and allocates) on ``side``."""
    return contextlib.nullcontext() if side is None else torch.cuda.stream(side)


def join(side: torch.cuda.Stream | None) -> None:
    """Make the current stream wait for the work queued on ``side``."""
    if side is not None:
        torch.cuda.current_stream(side.device).wait_stream(side)
