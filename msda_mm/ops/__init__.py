"""MSDA operator: the functional API and its torch.library ops (op.py), the
PyTorch reference (reference.py) and the input checks (validate.py); the
Triton kernels and their launchers by path (forward/, backward/,
deterministic/), what they share (jit_helpers.py, sampling.py, runtime.py,
fast_launch.py) and the tile policy (tiles.py).  Beside it,
linear_assignment/: the batched Hungarian matching as one Triton kernel."""
from .op import bf16_atomics_are_slow, multi_scale_deformable_attention, resolve_fp32_grad_accum
from .reference import level_start_index_from_shapes, msda_reference, point_softmax

__all__ = ["multi_scale_deformable_attention", "msda_reference", "level_start_index_from_shapes",
           "point_softmax", "resolve_fp32_grad_accum", "bf16_atomics_are_slow"]
