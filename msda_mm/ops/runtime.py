"""Launch plumbing that every path's launchers share: the device guard, the
grid and its limits, tile arithmetic, the accumulator dtype, whether a
tensor's rows are int32 words, the device's facts (PDL) and whether Triton
runs in its interpreter.  Inputs are assumed validated (validate.py)."""
from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton.language as tl


def interpreter_enabled() -> bool:
    """True when Triton runs kernels on the CPU (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def next_pow2(n: int) -> int:
    # Plain int arithmetic: triton.next_power_of_2 and triton.cdiv are
    # constexpr-function wrappers costing ~1.5 us a call (docs/design.md).
    return 1 << (n - 1).bit_length()


def contiguous_strides(shape) -> tuple[int, ...]:
    """The strides PyTorch gives a new contiguous tensor of ``shape`` (a
    dimension of size 0 counts as 1)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def acc_dtype(*tensors: torch.Tensor):
    # fp32 registers for fp32/fp16/bf16; fp64 only when asked for (gradcheck).
    return tl.float64 if any(t.dtype == torch.float64 for t in tensors) else tl.float32


def channel_pairs(t: torch.Tensor) -> bool:
    """Whether t's (..., D) rows are whole words of two fp16/bf16 (int32) or
    fp32 (int64) channels: unit channel stride, even D and strides, a start
    aligned to the word."""
    return (t.dtype in (torch.float16, torch.bfloat16, torch.float32) and t.stride(-1) == 1
            and t.shape[-1] % 2 == 0 and not any(st % 2 for st in t.stride()[:-1])
            and t.data_ptr() % (2 * t.element_size()) == 0)


def half_words(t: torch.Tensor) -> bool:
    """Whether t's (..., D) rows are whole int32 words of two fp16/bf16
    channels (channel_pairs of a 16-bit tensor)."""
    return t.element_size() == 2 and channel_pairs(t)


# device_guard's block where the device is current already (a nullcontext
# holds no state: one serves every launch).
_NO_GUARD = contextlib.nullcontext()


def device_guard(t: torch.Tensor):
    # Launch on the tensors' device, not the current one (cuda:1 inputs
    # while cuda:0 is current must work).  Entering torch.cuda.device costs
    # host time, so only when it changes anything.
    if t.is_cuda and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return _NO_GUARD


# CUDA's limit on a grid's second and third dimensions (heads M and batch B).
GRID_YZ_MAX = 65535


def grid(value: torch.Tensor, Q: int, block_q: int) -> tuple[int, int, int]:
    """(query blocks, M, B) for value (B, S, M, D), or ValueError for shapes
    the kernels do not take: M or B past the grid's limits, or S past int32
    (the kernels index positions in int32)."""
    B, S, M, _ = value.shape
    if max(B, M) > GRID_YZ_MAX or S >= 2**31:
        raise ValueError(f"value {tuple(value.shape)}: the Triton kernels take at most "
                         f"{GRID_YZ_MAX} batches B and heads M and fewer than 2**31 positions S")
    return (-(-Q // block_q), M, B)


@functools.lru_cache(maxsize=None)
def device_facts(index: int) -> tuple[tuple[int, int], int]:
    """(compute capability, SM count) of CUDA device ``index``, asked once:
    every backward needs both (docs/design.md)."""
    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor), props.multi_processor_count


def device_index(device: torch.device) -> int:
    return torch.cuda.current_device() if device.index is None else device.index


def pdl_available(device: torch.device) -> bool:
    """Programmatic dependent launch (a kernel starting before the one before
    it has finished): NVIDIA devices of compute capability >= 9.0, outside
    the interpreter (which has no inline PTX)."""
    return (device.type == "cuda" and torch.version.hip is None and not interpreter_enabled()
            and device_facts(device_index(device))[0] >= (9, 0))
