"""Measure one benchmark cell: one implementation on one input set."""
from __future__ import annotations

import math
from typing import Optional

import torch

from .impls import MSDAFn, bind
from .inputs import MSDAInputs
from .peers import PEERS
from .presets import Preset
from .timing import eager_times_us, graph_times_us, kernel_times_us, peak_memory_mb

# Output, then the gradients in argument order (value, locations, weights).
TENSORS = ("out", "grad_value", "grad_loc", "grad_attn")

# grad_loc jumps where a sample crosses a line of pixel centres (x * W - 0.5
# an integer: the four corners, and so the bilinear slopes, change), and
# fp32 rounding of x * W - 0.5 carries samples that close to such a line
# across it: a few elements of an exact kernel then miss by O(1).  grad_loc
# is compared on the samples at least this far from every such line.
_KINK_PX = 1e-3

# How each number is obtained, recorded in the JSON beside the numbers.
METHOD = {
    "fwd_us": "device time of the forward: median over CUDA-graph replays, CUDA events around "
              "each, L2 flushed (256 MB zeroed) before each; inputs require grad (training)",
    "bwd_us": "fwdbwd_us - fwd_us, fwdbwd_us timed like fwd_us on a graph of forward + "
              "torch.autograd.grad with a fixed grad_output",
    "fwd_warm_us/bwd_warm_us": "as fwd_us/bwd_us, but replays back to back without the L2 "
                               "flush: each finds what the previous one left in the L2",
    "fwd_kernel_us/bwd_kernel_us": "as fwd_us/bwd_us, but the sum of the call's kernel, memset "
                                   "and copy durations recorded by the CUDA profiler (CUPTI), "
                                   "median over eager calls after an L2 flush: without the "
                                   "graph launch that fwd_us includes (graph_floor_us)",
    "graph_floor_us": "fwd_us's timer on a graph of one one-element fill",
    "eager_fwd_us/eager_fwdbwd_us": "median wall time of plain Python calls, L2 flushed and "
                                    "device synchronised before, synchronised after",
    "host_fwd_us/host_fwdbwd_us": "median CPU time until the call returns, on an idle device "
                                  "(Python, dispatch, autograd and launches)",
    "host_fwdbwd_caller_us": "host_fwdbwd_us with the backward on the calling thread "
                             "(torch.autograd.set_multithreading_enabled(False)) instead of "
                             "autograd's device thread",
    "peak_fwd_mb/peak_bwd_mb": "peak torch.cuda.max_memory_allocated during the forward / "
                               "backward minus what was allocated before the forward "
                               "(inputs and grad_output)",
    "err_rel_*/err_abs_*": "||x - ref|| / ||ref|| and max |x - ref| against the float64 "
                           "reference on the same (dtype-rounded) inputs, grad_loc over samples "
                           f"at least {_KINK_PX} px from rows/columns of pixel centres; "
                           "max_err = largest err_rel_*",
    "gather_gbps": "B*Q*M*L*K * 4 corners * D * value element size / fwd_us",
    "cpu": "on --device cpu, fwd_us and fwdbwd_us are the eager wall times (no graphs)",
    "mmcv/mmcv_cuda": "mmcv's MultiScaleDeformableAttnFunction as its module calls it "
                      "(locations and weights cast to value's dtype, im2col_step 64) on "
                      "compiled mmcv's CUDA kernels / on msda_mm's build of them from the mmcv "
                      "sdist (tools/build_mmcv_msda.py), same timers as the others",
    **{impl: f"{peer.module}.{peer.function} ({peer.install}; bench/op/peers.py) with "
             f"locations and weights cast to value's dtype, {peer.kernel}, same timers as "
             "the others" for impl, peer in PEERS.items()},
}


def _leaves(inputs: MSDAInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Fresh leaves that require grad, so that the shared input tensors do not.
    return tuple(t.detach().requires_grad_() for t in
                 (inputs.value, inputs.sampling_locations, inputs.attention_weights))


def reference_fp64(inputs: MSDAInputs) -> tuple[torch.Tensor, ...]:
    """(out, grad_value, grad_loc, grad_attn) of the PyTorch reference in
    float64 on ``inputs`` (value and grad_output as rounded to their dtype)."""
    args = tuple(t.double() for t in _leaves(inputs))
    out = bind("reference", inputs)(*args)
    return (out.detach(), *torch.autograd.grad(out, args, inputs.grad_output.double()))


def _off_kinks(inputs: MSDAInputs) -> torch.Tensor:
    """(B, Q, M, L, K, 1) bool: the sample is _KINK_PX or more from every
    row and column of pixel centres of its level."""
    wh = inputs.spatial_shapes.flip(-1).double()  # (L, 2) as (W, H)
    px = inputs.sampling_locations.double() * wh[:, None, :] - 0.5
    return ((px - px.round()).abs() >= _KINK_PX).all(-1, keepdim=True)


def _errors(results, reference, inputs: MSDAInputs) -> dict:
    errors = {}
    for name, got, ref in zip(TENSORS, results, reference):
        diff = got.detach().double() - ref
        if name == "grad_loc":
            keep = _off_kinks(inputs).expand_as(ref)
            diff, ref = diff[keep], ref[keep]
        errors[f"err_rel_{name}"] = (diff.norm() / ref.norm()).item()
        errors[f"err_abs_{name}"] = diff.abs().max().item()
    rels = [errors[f"err_rel_{name}"] for name in TENSORS]
    errors["max_err"] = math.nan if any(map(math.isnan, rels)) else max(rels)
    return errors


def measure(record: dict, fn: MSDAFn, inputs: MSDAInputs, reference: Optional[tuple],
            preset: Preset, budget_ms: float) -> None:
    """Add the cell's numbers (see METHOD) to ``record`` one by one, so that an
    exception (say out of memory) leaves those already measured.
    ``reference``: reference_fp64's tensors, or None to skip the errors."""
    device = inputs.value.device
    args = _leaves(inputs)
    grad_output = inputs.grad_output

    def forward():
        return fn(*args)

    def forward_backward():
        return torch.autograd.grad(fn(*args), args, grad_output)

    if device.type == "cuda":
        state = {}
        record["peak_fwd_mb"], record["peak_bwd_mb"] = peak_memory_mb(
            device, lambda: state.update(out=forward()),
            lambda: torch.autograd.grad(state["out"], args, grad_output))
        del state
    if reference is not None:
        out = forward()
        record.update(_errors((out, *torch.autograd.grad(out, args, grad_output)), reference,
                              inputs))
        del out
    record["eager_fwd_us"], record["host_fwd_us"] = eager_times_us(forward, device, budget_ms)
    record["eager_fwdbwd_us"], record["host_fwdbwd_us"] = eager_times_us(
        forward_backward, device, budget_ms)
    if device.type == "cuda":
        with torch.autograd.set_multithreading_enabled(False):
            record["host_fwdbwd_caller_us"] = eager_times_us(forward_backward, device,
                                                             budget_ms)[1]
        fwd, fwd_warm = graph_times_us(forward, device, budget_ms)
        fwdbwd, fwdbwd_warm = graph_times_us(forward_backward, device, budget_ms)
        record.update(fwd_warm_us=fwd_warm, bwd_warm_us=fwdbwd_warm - fwd_warm)
    else:
        # Host times are CUDA's only (on CPU the wall time is the host's): no third timing.
        record["host_fwdbwd_caller_us"] = None
        fwd, fwdbwd = record["eager_fwd_us"], record["eager_fwdbwd_us"]
    record.update(fwd_us=fwd, bwd_us=fwdbwd - fwd, fwdbwd_us=fwdbwd)
    if device.type == "cuda":
        # A second opinion only: no CUPTI (another profiler running, or none
        # allowed) leaves these two empty, not the cell.
        try:
            fwd_kernel = kernel_times_us(forward, device)
            record.update(fwd_kernel_us=fwd_kernel,
                          bwd_kernel_us=kernel_times_us(forward_backward, device) - fwd_kernel)
        except RuntimeError as e:
            record.update(fwd_kernel_us=None, bwd_kernel_us=None,
                          note=(record.get("note") or "") + f"no kernel times: {e}")
    record["gather_gbps"] = preset.gathered_bytes(inputs.value.element_size()) / (fwd * 1e3)
