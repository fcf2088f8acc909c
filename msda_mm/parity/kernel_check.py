"""Do msda_mm's bf16 kernels compute what its fp32 kernels compute, on the
inputs a real model gives them?  (tools/parity.py kernels;
tests/ops/test_msda_bf16_matches_fp32.py on random inputs.)

Under bf16 AMP the op gets a bf16 value, fp32 locations and the attention
logits (TritonMSDeformAttn passes them with softmax=True; checked here upcast
to fp32, which is exact), and output_proj rounds its output to bf16
whatever dtype it has.  So the bf16
kernels and the fp32 kernels fed the same values upcast differ only by the
output's rounding and the order of fp32 sums: the bf16 output, and
grad_value accumulated in fp32, must be the fp32 kernels' result rounded
(to nearest on the GPU, half a bf16 unit; Triton's interpreter truncates, a
whole unit) give or take summation-order noise, bounded by 2**-16 of the sum
of the absolute terms (the same op on |value| and |grad_out|: the attention
and bilinear weights are non-negative); the location and weight gradients
(fp32) within 1e-5 relative.  A kernel that multiplied or summed in bf16
would be off by ~2**-9 of its terms, and one that truncated on the GPU by up
to a whole unit.

Where mmcv's own CUDA kernels are here (``attention.MmcvSide``), each call
also reports how far msda_mm's fp32 kernels are from them on the same fp32
inputs (relative differences, reported beside the verdict, not part of it:
mmcv has no bf16 kernels to check).
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Callable, Iterator, Optional
from unittest import mock

import torch
from torch import Tensor

from ..compat import mmcv_cuda_switch
from ..models import triton_ms_deform_attn
from ..ops import multi_scale_deformable_attention, point_softmax
from .attention import MmcvSide
from .gradients import relative_difference

# Relative bound of the location and weight gradients (fp32 sums in another order).
GRAD_REL_TOL = 1e-5
# Summation-order noise, relative to the sum of the absolute terms.
ORDER_NOISE = 2.0**-16


def bf16_excess(got: Tensor, want: Tensor, magnitude: Tensor, units: float) -> Tensor:
    """Per element, how many bf16 units (8 significant bits, at the larger of
    got and want: they may straddle a power of two) ``got`` is past ``units``
    units plus ORDER_NOISE * ``magnitude`` away from ``want``; <= 0 where it
    is within."""
    got, want, magnitude = got.double(), want.double(), magnitude.double()
    larger = torch.maximum(got.abs(), want.abs()).clamp_min(2.0**-100)
    spacing = torch.exp2(torch.floor(torch.log2(larger)) - 7)
    return ((got - want).abs() - units * spacing - ORDER_NOISE * magnitude) / spacing


def forward_backward(args: dict, value: Tensor, grad_out: Tensor,
                      fp32_grad_accum: Optional[bool],
                      op: Optional[Callable] = None) -> tuple[Tensor, ...]:
    """(output, grad_value, grad_loc, grad_attn) on ``args`` with ``value`` of
    the op with ``fp32_grad_accum`` (and ``args``' softmax flag), or of ``op``
    (value, spatial_shapes, level_start_index, locations, weights) if given."""
    if op is None:
        op = partial(multi_scale_deformable_attention, fp32_grad_accum=fp32_grad_accum,
                     softmax=args.get("softmax", False))
    leaves = [t.detach().clone().requires_grad_()
              for t in (value, args["sampling_locations"], args["attention_weights"])]
    out = op(leaves[0], args["spatial_shapes"], args["level_start_index"], leaves[1], leaves[2])
    return (out.detach(), *torch.autograd.grad(out, leaves, grad_out.to(out.dtype)))


def compare_to_mmcv(args: dict, grad_out: Tensor, mmcv: MmcvSide) -> dict:
    """Relative differences (gradients.relative_difference) of msda_mm's fp32
    kernels from ``mmcv``'s kernels, both on ``args`` and ``grad_out``
    upcast to fp32: output, grad_value, grad_loc, grad_attn."""
    def mmcv_op(value, shapes, starts, locations, weights):
        if args.get("softmax", False):
            weights = point_softmax(weights)  # mmcv's module takes it before its op
        # mmcv's kernels take contiguous tensors only (its module makes them so).
        return mmcv_cuda_switch.mmcv_function(value.contiguous(), shapes, starts,
                                              locations.contiguous(), weights.contiguous())

    value, grad_out = args["value"].float(), grad_out.float()
    with torch.autocast(value.device.type, enabled=False), torch.enable_grad():
        ours = forward_backward(args, value, grad_out, None)
        with mmcv.route():
            theirs = forward_backward(args, value, grad_out, None, mmcv_op)
    return {name: relative_difference(a, b) for name, a, b in
            zip(("output", "grad_value", "grad_loc", "grad_attn"), ours, theirs)}


def compare_to_fp32(args: dict, grad_out: Tensor, fp32_grad_accum: bool) -> dict:
    """The op on ``args`` (value bf16; the op's other arguments by name) and
    bf16 ``grad_out`` (B, Q, M * D), against the same op on the value and
    grad_out upcast to fp32.  Returns the worst excess in bf16 units of the
    output and (fp32_grad_accum only: native bf16 atomics round every
    partial sum) of grad_value (<= 0 within, see bf16_excess), the relative
    differences of grad_loc and grad_attn, whether the bf16 op's results
    have its inputs' dtypes (output and grad_value bf16, grad_loc and
    grad_attn those of the locations and weights), and ``passed``: all of
    them within (a NaN anywhere fails)."""
    value = args["value"]
    if value.dtype != torch.bfloat16:
        raise TypeError(f"compare_to_fp32 checks a bf16 value, got {value.dtype}")
    with torch.autocast(value.device.type, enabled=False), torch.enable_grad():
        out32, gv32, gl32, ga32 = forward_backward(args, value.float(), grad_out.float(), None)
        out16, gv16, gl16, ga16 = forward_backward(args, value, grad_out, fp32_grad_accum)
        out_abs, gv_abs, _, _ = forward_backward(args, value.float().abs(),
                                                  grad_out.float().abs(), None)
    units = 0.5 if value.is_cuda else 1.0
    result = dict(output=bf16_excess(out16, out32, out_abs, units).max().item(),
                  grad_value=(bf16_excess(gv16, gv32, gv_abs, 0.5).max().item()
                              if fp32_grad_accum else None),
                  grad_loc=relative_difference(gl16, gl32),
                  grad_attn=relative_difference(ga16, ga32),
                  dtypes_match=(out16.dtype == gv16.dtype == torch.bfloat16
                                and gl16.dtype == args["sampling_locations"].dtype
                                and ga16.dtype == args["attention_weights"].dtype))
    # Each comparison on its own, and false for NaN (max() would skip one).
    result["passed"] = bool(result["output"] <= 0
                            and (result["grad_value"] is None or result["grad_value"] <= 0)
                            and result["grad_loc"] < GRAD_REL_TOL
                            and result["grad_attn"] < GRAD_REL_TOL and result["dtypes_match"])
    return result


@contextmanager
def checked_calls(max_calls: int = 32, seed: int = 0,
                  mmcv: Optional[MmcvSide] = None) -> Iterator[list[dict]]:
    """Inside the block, each of the first ``max_calls`` calls with a bf16
    value that a TritonMSDeformAttn makes to the op is also checked by
    compare_to_fp32 (with a random bf16 grad_out; fp32 accumulation, and
    on CUDA native atomics too), and for CUDA values with ``mmcv`` on mmcv's
    CUDA kernels by compare_to_mmcv ('mmcv_fp32'; else None); one dict per
    call and accumulation is appended to the yielded list.  The calls
    themselves run unchanged."""
    results: list[dict] = []
    generator = torch.Generator().manual_seed(seed)
    op = triton_ms_deform_attn.multi_scale_deformable_attention

    def checking(value, spatial_shapes, level_start_index, sampling_locations,
                 attention_weights, **kwargs):
        calls = len({r["call"] for r in results})
        if value.dtype == torch.bfloat16 and calls < max_calls:
            softmax = kwargs.get("softmax", False)
            # The module's logits (softmax=True) leave the attention_weights
            # Linear in bf16 under AMP: upcast (exactly), their gradient is
            # compared in fp32 as that of the fp32 weights was.
            weights = attention_weights.detach()
            args = dict(value=value.detach(), spatial_shapes=spatial_shapes,
                        level_start_index=level_start_index,
                        sampling_locations=sampling_locations.detach(),
                        attention_weights=weights.float() if softmax else weights,
                        softmax=softmax)
            B, Q, M = sampling_locations.shape[:3]
            grad_out = torch.randn(B, Q, M * value.shape[-1], generator=generator)
            grad_out = grad_out.to(value.device, torch.bfloat16)
            to_mmcv = (compare_to_mmcv(args, grad_out, mmcv) if value.is_cuda and mmcv
                       and mmcv.kernels == "cuda" else None)
            for accum in (True, False) if value.is_cuda else (True,):
                results.append(dict(call=calls, value=list(value.shape),
                                    locations=list(sampling_locations.shape),
                                    location_dtype=str(sampling_locations.dtype),
                                    fp32_grad_accum=accum,
                                    **compare_to_fp32(args, grad_out, accum),
                                    mmcv_fp32=to_mmcv))
        return op(value, spatial_shapes, level_start_index, sampling_locations,
                  attention_weights, **kwargs)

    with mock.patch.object(triton_ms_deform_attn, "multi_scale_deformable_attention", checking):
        yield results
