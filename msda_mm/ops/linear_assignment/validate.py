"""Input checks of the linear assignment: clear Python exceptions naming the
argument and what was seen.  Only metadata is read (shapes, dtypes,
devices), never num_cols' values, so a check costs no host
synchronisation."""
from __future__ import annotations

import torch

from ..runtime import interpreter_enabled

COST_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Rows are lanes of one program's registers, 8 a thread at 16 warps (a
# block's most threads at 128 registers each): more rows would spill.
MAX_ROWS = 4096


def check_problems(cost, num_cols) -> None:
    """TypeError/ValueError unless cost is (P, N, G) fp16/bf16/fp32 with
    G <= N and num_cols a (P,) int32/int64 tensor on cost's device."""
    if not isinstance(cost, torch.Tensor):
        raise TypeError(f"cost must be a torch.Tensor, got {type(cost).__name__}")
    if not isinstance(num_cols, torch.Tensor):
        raise TypeError(f"num_cols must be a torch.Tensor, got {type(num_cols).__name__}")
    if cost.dtype not in COST_DTYPES:
        raise TypeError(f"cost must be float16, bfloat16 or float32, got {cost.dtype}")
    if num_cols.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"num_cols must be an int32 or int64 tensor, got {num_cols.dtype}")
    if cost.dim() != 3:
        raise ValueError(f"cost must be (P, N, G) (problems, rows, columns), got shape "
                         f"{tuple(cost.shape)}")
    P, N, G = cost.shape
    if N < G:
        raise ValueError(f"cost {tuple(cost.shape)}: every column needs a row of its own, so "
                         f"N >= G is required (rows = queries, columns = GT slots); got N={N} "
                         f"< G={G}")
    if num_cols.shape != (P,):
        raise ValueError(f"num_cols must be ({P},), one count per problem of cost "
                         f"{tuple(cost.shape)}, got shape {tuple(num_cols.shape)}")
    if num_cols.device != cost.device:
        raise ValueError(f"num_cols is on {num_cols.device}, cost on {cost.device}: both must "
                         f"be on one device")


def check_kernel_call(cost) -> None:
    """ValueError unless the Triton kernel can take cost: at most MAX_ROWS
    rows, every element of a problem at an int32 offset from the problem's
    first (the kernel's offsets within a problem are int32), on a CUDA
    device or on the CPU in Triton's interpreter."""
    _, N, G = cost.shape
    if N > MAX_ROWS:
        raise ValueError(f"cost {tuple(cost.shape)}: the kernel takes at most {MAX_ROWS} rows N, "
                         f"got {N}")
    last = (N - 1) * cost.stride(1) + (G - 1) * cost.stride(2)
    if last >= 2**31:
        raise ValueError(f"cost {tuple(cost.shape)} with strides {cost.stride()}: a problem's "
                         f"elements must lie within 2**31 elements of its first, got {last}")
    if not (cost.device.type == "cuda" or (cost.device.type == "cpu" and interpreter_enabled())):
        raise ValueError(f"cost is on {cost.device}: the Triton kernel takes CUDA tensors, or "
                         f"CPU tensors with TRITON_INTERPRET=1 (linear_assignment_reference "
                         f"takes CPU tensors)")
