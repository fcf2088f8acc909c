"""Host tensors moved to a device in one copy that does not wait.

A copy from pageable host memory makes CUDA wait for the stream, once per
tensor (DINO's data: each image, its GT boxes and its labels).  Here the
tensors' bytes are packed into one pinned buffer, copied with
``non_blocking=True`` (queued behind the work already on the stream; the
caching host allocator keeps the pinned block until the copy is done) and
split on the device into views of that copy.  Such a copy is refused while
a CUDA graph is captured: every replay would read the pinned buffer again,
long after it was given to other data.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
from torch import Tensor

# Each tensor's bytes start at a multiple of 16: every dtype's element size
# divides it, so each piece can be viewed as its own dtype.
_ALIGN = 16

# Per tensor: byte offset, byte count, dtype, shape.
Layout = List[Tuple[int, int, torch.dtype, torch.Size]]


def pack(tensors: Sequence[Tensor], pin: bool) -> Tuple[Tensor, Layout]:
    """The bytes of ``tensors`` (CPU) in one uint8 buffer, pinned if ``pin``,
    and the layout ``unpack`` needs."""
    layout, offset = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        layout.append((offset, nbytes, t.dtype, t.shape))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    buffer = torch.empty(offset, dtype=torch.uint8, pin_memory=pin)
    for t, (start, nbytes, _, _) in zip(tensors, layout):
        buffer[start:start + nbytes].view(t.dtype).view(t.shape).copy_(t)
    return buffer, layout


def unpack(buffer: Tensor, layout: Layout) -> List[Tensor]:
    """The tensors ``pack`` put into ``buffer`` (any device), as views of it."""
    return [buffer[start:start + nbytes].view(dtype).view(shape)
            for start, nbytes, dtype, shape in layout]


def to_device(tensors: Sequence[Tensor], device: torch.device) -> List[Tensor]:
    """``tensors`` (CPU, contiguous or not) on ``device``, contiguous: on CUDA
    in one pinned, non-blocking copy; elsewhere each by ``Tensor.to``.
    RuntimeError on CUDA while the current stream is captured."""
    if device.type != "cuda" or not tensors:
        return [t.to(device) for t in tensors]
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{len(tensors)} host tensor(s) of shapes {[tuple(t.shape) for t in tensors]} "
            f"copied to the device while a CUDA graph is captured: each replay would read "
            f"their pinned buffer again, after it holds other data; make them on the device, "
            f"or once before the capture and keep them")
    buffer, layout = pack(tensors, pin=True)
    return unpack(buffer.to(device, non_blocking=True), layout)
