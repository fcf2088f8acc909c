"""grad_value's fill in front of the float-atomic backward: zero_fill_kernel
where the backward may then start at once (PDL), PyTorch's fill elsewhere."""
from __future__ import annotations

import torch

from .. import runtime
from ..fast_launch import FastLaunch
from . import kernels

zero_fill_kernel = FastLaunch(kernels.zero_fill_kernel)

# zero_fill_kernel: at most _FILL_PROGRAMS_PER_SM programs an SM, all resident, so that the
# backward launched behind it (PDL) starts at once (docs/design.md).
_FILL = dict(BLOCK=4096, num_warps=4)
_FILL_PROGRAMS_PER_SM = 4


def fill_zeros(t: torch.Tensor) -> bool:
    """Zero the contiguous tensor ``t`` in place with one kernel.  Returns
    whether the next kernel may be launched with PDL: ``t``'s device has it
    and a fill kernel ran (all work before it has finished, and the next
    kernel's gdc_wait waits for the fill itself).

    zero_fill_kernel, which lets the next kernel start at once, zeroes
    16-bit buffers of whole 4-byte words where PDL exists, and every
    buffer of whole words in the interpreter (so that the CPU tests run
    the kernel sm_90 runs).  Everything else goes through PyTorch's fill,
    16-bit buffers of even size as int32 words, which PyTorch writes faster
    than 16-bit zeros (docs/design.md).
    """
    numel, size = t.numel(), t.element_size()
    if not numel:
        return False  # nothing to fill: no kernel right before the next one
    pdl = runtime.pdl_available(t.device)
    whole_words = numel * size % 4 == 0
    # The kernel: 16-bit words where PDL exists, any words in the interpreter
    # (which never has PDL).
    if not whole_words or not (size == 2 if pdl else runtime.interpreter_enabled()):
        # 16-bit words as int32, anything else as it is (no view op).
        (t.view(-1).view(torch.int32) if size == 2 and whole_words else t).zero_()
        return pdl
    words = t.view(-1).view(torch.int32)
    n = words.numel()
    blocks = -(-n // _FILL["BLOCK"])
    # The interpreter has no SMs to fill; two programs still take the
    # grid-stride loop through more than one step.
    resident = (runtime.device_facts(runtime.device_index(t.device))[1] * _FILL_PROGRAMS_PER_SM
                if t.is_cuda else 2)
    with runtime.device_guard(t):
        zero_fill_kernel[(min(blocks, resident),)](words, n, PDL=pdl, **_FILL)
    return pdl
