"""MSDA operator: Triton kernels, launchers, torch.library op, reference."""
from .msda import bf16_atomics_are_slow, multi_scale_deformable_attention, resolve_fp32_grad_accum
from .reference import level_start_index_from_shapes, msda_reference, point_softmax

__all__ = ["multi_scale_deformable_attention", "msda_reference", "level_start_index_from_shapes",
           "point_softmax", "resolve_fp32_grad_accum", "bf16_atomics_are_slow"]
