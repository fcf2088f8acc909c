"""The MSDA operator: ``torch.library`` custom ops (forward, backward) with
fake implementations and autograd, and the mmcv-compatible functional API.

Dispatch: CUDA tensors run the Triton kernels (through the custom ops under
``torch.compile``, through a plain autograd.Function in eager mode, which
costs far less host time: see ``EagerMSDA``); so do CPU tensors when
``TRITON_INTERPRET=1`` (the kernels run in Triton's
interpreter, which is how CI tests them).  Other CPU tensors run the
pure-PyTorch reference with plain autograd.  The custom ops are opaque to
``torch.compile``, so a compiled model has no graph break here, and no host
synchronisation happens in either direction (CUDA-graph capturable).

Determinism: the forward has no atomics.  By default the Triton backward
sums grad_value with float atomic adds (the order, and so the rounding,
varies run to run); with ``deterministic=True`` or under
``torch.use_deterministic_algorithms(True)`` it sums it without atomics,
per value row in a fixed order or exactly, which gives bitwise-identical
gradients every run (docs/determinism.md).
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch import Tensor

from .backward.launcher import launch_backward, run_backward
from .eager_plans import EagerPlans
from .forward.launcher import launch_forward, run_forward
from .reference import msda_reference, point_softmax
from .runtime import interpreter_enabled
from .tiles import TUNED, Tiles, current_tiles
from .validate import check_inputs, check_levels, check_optional_bool


def _use_triton(t: Tensor) -> bool:
    return t.is_cuda or interpreter_enabled()


def _require_triton(t: Tensor) -> None:
    if not _use_triton(t):
        raise RuntimeError(f"msda_mm's Triton op needs CUDA tensors, or TRITON_INTERPRET=1 for "
                           f"CPU ones; got {t.device}. multi_scale_deformable_attention runs "
                           f"the PyTorch reference on CPU.")


def bf16_atomics_are_slow(device: torch.device) -> bool:
    """True where a bf16 atomic add is no native instruction: compute
    capability < 9.0 (A100: a compare-and-swap loop, ~10x slower) and the
    Triton interpreter (no bf16 atomics at all)."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) < (9, 0)
    return True


def resolve_fp32_grad_accum(value: Tensor, fp32_grad_accum: Optional[bool]) -> bool:
    """Whether grad_value is accumulated in an fp32 scratch buffer (rounded
    to value's dtype once at the end) instead of by atomics in value's dtype.

    Auto (None): only for bf16 value where bf16 atomics are slow or missing.
    fp16 has native atomics from sm_70 on and stays native everywhere.
    """
    if fp32_grad_accum is None:
        return value.dtype == torch.bfloat16 and bf16_atomics_are_slow(value.device)
    if not fp32_grad_accum and value.dtype == torch.bfloat16 and not value.is_cuda:
        raise ValueError("fp32_grad_accum=False needs native bf16 atomics, which the Triton "
                         "interpreter (TRITON_INTERPRET=1) does not have; use None or True")
    return bool(fp32_grad_accum)


def _is_empty(value: Tensor, sampling_locations: Tensor) -> bool:
    # No output element (B, Q, M or D is 0): nothing to launch or sample.
    B, Q, M = sampling_locations.shape[:3]
    return value.shape[3] == 0 or B * Q * M == 0


def resolve_deterministic(deterministic: Optional[bool]) -> bool:
    """Whether the backward sums grad_value without atomics (bitwise the same
    every run): as asked, or (None) as torch.are_deterministic_algorithms_enabled()
    says when the backward runs."""
    if deterministic is None:
        return torch.are_deterministic_algorithms_enabled()
    return deterministic


def _alert_nondeterministic() -> None:
    # PyTorch's convention for ops with atomics (e.g. grid_sample's CUDA
    # backward): raise under use_deterministic_algorithms(True), warn under
    # warn_only=True.  Only an explicit deterministic=False gets here in that
    # mode (None follows it); the CPU reference path is deterministic throughout.
    if not torch.are_deterministic_algorithms_enabled():
        return
    msg = ("msda_mm backward with deterministic=False (grad_value accumulated with float "
           "atomic adds) does not have a deterministic implementation, but you set "
           "'torch.use_deterministic_algorithms(True)'")
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(msg + " with warn_only=True.", stacklevel=3)
    else:
        raise RuntimeError(msg + ". Use deterministic=None or True (grad_value "
                           "gathered per value row), or warn_only=True.")


def _forward_impl(value, spatial_shapes, sampling_locations,
                  attention_weights, softmax, tiles: Tiles) -> Tensor:
    if _is_empty(value, sampling_locations):
        B, _, M, D = value.shape
        return value.new_zeros(B, sampling_locations.shape[1], M * D)
    _require_triton(value)
    check_levels(spatial_shapes, None, value.shape[1])
    return launch_forward(value, spatial_shapes, sampling_locations,
                          attention_weights, softmax, tiles)


def _backward_impl(grad_output, value, spatial_shapes, sampling_locations,
                   attention_weights, fp32_grad_accum, deterministic, softmax, tiles: Tiles):
    if _is_empty(value, sampling_locations):
        return (value.new_zeros(value.shape),
                sampling_locations.new_zeros(sampling_locations.shape),
                attention_weights.new_zeros(attention_weights.shape))
    _require_triton(value)
    if resolve_deterministic(deterministic):
        return _deterministic_backward(grad_output, value, spatial_shapes, sampling_locations,
                                       attention_weights, softmax, tiles)
    _alert_nondeterministic()
    return launch_backward(grad_output, value, spatial_shapes, sampling_locations,
                           attention_weights,
                           resolve_fp32_grad_accum(value, fp32_grad_accum), softmax=softmax,
                           tiles=tiles)


def _deterministic_backward(grad_output, value, spatial_shapes, sampling_locations,
                            attention_weights, softmax, tiles: Tiles):
    """The deterministic backward; with ``softmax`` the weights are logits: it
    runs on their point_softmax p (its grad_value needs the weights),
    and the logits' gradient is softmax's own backward of grad_attn.

    The default backward takes the softmax inside its kernel instead; here p
    is recomputed, not kept from the forward: kept, it would be a second
    forward output, in fp32 where AMP logits are bf16 (twice the saved bytes)."""
    def backward(weights):
        return launch_backward(grad_output, value, spatial_shapes, sampling_locations, weights,
                               fp32_grad_accum=False, deterministic=True, tiles=tiles)

    if not softmax:
        return backward(attention_weights)
    p = point_softmax(attention_weights)
    grad_value, grad_loc, grad_p = backward(p)
    # Autograd's own softmax backward, p * (grad_p - sum(p * grad_p)), in p's dtype.
    grad_logits = torch._softmax_backward_data(grad_p.flatten(-2), p.flatten(-2), -1, p.dtype)
    return (grad_value, grad_loc,
            grad_logits.view(attention_weights.shape).to(attention_weights.dtype))


@torch.library.custom_op("msda_mm::msda_forward", mutates_args=())
def msda_forward(value: Tensor, spatial_shapes: Tensor, sampling_locations: Tensor,
                 attention_weights: Tensor,
                 fp32_grad_accum: Optional[bool], deterministic: Optional[bool],
                 softmax: bool = False) -> Tensor:
    """Shapes as in ``multi_scale_deformable_attention``; returns (B, Q, M*D)
    in value's dtype.  fp32_grad_accum and deterministic only travel to the
    backward; softmax: attention_weights are logits (see the functional
    API).  Both custom ops launch with the tuned tiles (tiles.TUNED): the
    backward may run on another thread than the forward, where
    tile_override's block is not in force."""
    return _forward_impl(value, spatial_shapes, sampling_locations,
                         attention_weights, softmax, TUNED)


@msda_forward.register_fake
def _(value, spatial_shapes, sampling_locations, attention_weights,
      fp32_grad_accum, deterministic, softmax=False):
    B, _, M, D = value.shape
    return value.new_empty(B, sampling_locations.shape[1], M * D)


@torch.library.custom_op("msda_mm::msda_backward", mutates_args=())
def msda_backward(grad_output: Tensor, value: Tensor, spatial_shapes: Tensor,
                  sampling_locations: Tensor,
                  attention_weights: Tensor, fp32_grad_accum: Optional[bool],
                  deterministic: Optional[bool], softmax: bool = False
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (grad_value, grad_sampling_locations, grad_attention_weights),
    contiguous, each in its input's shape and dtype; with softmax,
    attention_weights are the forward's logits and the last gradient is
    theirs."""
    return _backward_impl(grad_output, value, spatial_shapes,
                          sampling_locations, attention_weights, fp32_grad_accum, deterministic,
                          softmax, TUNED)


@msda_backward.register_fake
def _(grad_output, value, spatial_shapes, sampling_locations,
      attention_weights, fp32_grad_accum, deterministic, softmax=False):
    return (value.new_empty(value.shape), sampling_locations.new_empty(sampling_locations.shape),
            attention_weights.new_empty(attention_weights.shape))


def _setup_context(ctx, inputs, output):
    (value, spatial_shapes, sampling_locations, attention_weights, accum,
     deterministic, softmax) = inputs
    ctx.save_for_backward(value, spatial_shapes, sampling_locations,
                          attention_weights)
    ctx.fp32_grad_accum = accum
    ctx.deterministic = deterministic
    ctx.softmax = softmax


def _backward(ctx, grad_output):
    grad_value, grad_loc, grad_attn = msda_backward(
        grad_output, *ctx.saved_tensors, ctx.fp32_grad_accum, ctx.deterministic, ctx.softmax)
    return grad_value, None, grad_loc, grad_attn, None, None, None


msda_forward.register_autograd(_backward, setup_context=_setup_context)


# The eager op's plans (eager_plans.py).
_PLANS = EagerPlans()


class EagerMSDA(torch.autograd.Function):
    """The same two launches as the custom ops, for eager mode.

    Why a second entry point: the custom-op wrappers alone cost about 4x the
    host time of an autograd.Function a forward (docs/design.md).  The
    backward's Python runs about 2x slower on autograd's device thread than
    on the calling thread, so the forward looks up the backward's launch plan
    (backward/launcher.py's plan_backward) with its own, both made once per
    call signature (eager_plans.py), and the backward only allocates and
    launches.  The forward also resolves the tile policy
    (tiles.current_tiles) on the calling thread and carries it to the
    backward.  Only multi_scale_deformable_attention calls it, after its
    checks of the device and the levels.  torch.compile sees only the
    custom ops.
    """

    @staticmethod
    def forward(ctx, value, spatial_shapes, sampling_locations,
                attention_weights, fp32_grad_accum, deterministic, softmax):
        _setup_context(ctx, (value, spatial_shapes, sampling_locations,
                             attention_weights, fp32_grad_accum, deterministic, softmax), None)
        ctx.tiles = tiles = current_tiles()
        if _is_empty(value, sampling_locations):
            ctx.plan = None
            return _forward_impl(value, spatial_shapes, sampling_locations,
                                 attention_weights, softmax, tiles)
        # Planned for the float-atomic backward only; the backward checks the mode again.
        atomic = not resolve_deterministic(deterministic)
        plan = _PLANS.get(value, sampling_locations, attention_weights, softmax, tiles,
                          resolve_fp32_grad_accum(value, fp32_grad_accum) if atomic else None)
        ctx.plan = plan.backward
        return run_forward(plan.forward, value, spatial_shapes, sampling_locations,
                           attention_weights)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        if ctx.plan is None or resolve_deterministic(ctx.deterministic):
            grads = _backward_impl(grad_output, *ctx.saved_tensors, ctx.fp32_grad_accum,
                                   ctx.deterministic, ctx.softmax, ctx.tiles)
        else:
            _alert_nondeterministic()
            grads = run_backward(ctx.plan, grad_output, *ctx.saved_tensors)
        return grads[0], None, grads[1], grads[2], None, None, None


def multi_scale_deformable_attention(
    value: Tensor,
    spatial_shapes: Tensor,
    level_start_index: Optional[Tensor],
    sampling_locations: Tensor,
    attention_weights: Tensor,
    im2col_step: Optional[int] = None,
    *,
    fp32_grad_accum: Optional[bool] = None,
    deterministic: Optional[bool] = None,
    softmax: bool = False,
) -> Tensor:
    """Multi-Scale Deformable Attention, a drop-in for mmcv's
    ``MultiScaleDeformableAttnFunction.apply`` (same positional arguments).

    Args:
        value: (B, S, M, D) float, S = sum_l H_l * W_l.
        spatial_shapes: (L, 2) int32/int64 (H_l, W_l).
        level_start_index: (L,) int offsets of each level in S (the levels
            tile S in order, so these are the cumulative H_l * W_l), or None.
        sampling_locations: (B, Q, M, L, K, 2) normalised (x, y); may be a
            different float dtype than value (kept, never rounded to value's).
        attention_weights: (B, Q, M, L, K) float, any float dtype: the
            weights of the samples, or with ``softmax`` their logits.
        im2col_step: accepted for mmcv compatibility and ignored.
        fp32_grad_accum: accumulate grad_value in fp32 scratch (True), in
            value's dtype with native atomics (False), or choose from the
            device (None): fp32 only for bf16 below compute capability 9.0.
            Unused by the deterministic backward.
        deterministic: sum grad_value without atomics (True), so that
            the backward gives bitwise-identical gradients run to run (same
            inputs, device model, msda_mm and Triton versions); with float
            atomic adds (False: raises under
            ``torch.use_deterministic_algorithms(True)``, warns with
            ``warn_only=True``); or as
            ``torch.are_deterministic_algorithms_enabled()`` says when the
            backward runs (None).  The samples are sorted by cell on the
            device, then gathered per value row.  Rows of 2 entries or
            more (the encoders, DINO's decoder) take a stable sort and sum in fp32 (fp64 for fp64
            values) in sample order: grad_value is what fp32_grad_accum=True
            gives up to the order of the adds, and inf or NaN reach only the
            rows their terms reach.  Sparser rows (the Deformable DETR
            decoder) take a
            counting sort and sum exact integers at a power-of-two scale per
            value row: at least as accurate as fp32_grad_accum=True, its
            inf and NaN terms summed apart (docs/determinism.md).
            grad_sampling_locations and
            grad_attention_weights have no atomics: deterministic either way.
        softmax: attention_weights are raw logits, and the weights are
            their softmax over the L * K points of each (query, head),
            taken inside the forward kernel (max subtracted, in fp32 or
            fp64 like the rest) and its gradient inside the backward kernel
            (the deterministic backward: in PyTorch around it), in place of
            mmcv's separate ``attention_weights.softmax(-1)`` before the op:
            one kernel and one (B, Q, M, L, K) tensor less in the forward,
            one kernel less in the backward.  Same result as
            ``point_softmax`` (a softmax in at least fp32) before the op;
            the gradient for attention_weights is that of the logits
            (docs/fused_softmax.md).

    Returns:
        (B, Q, M * D) in value's dtype.  Gradients flow to value,
        sampling_locations and attention_weights, each in its own dtype.

    Non-finite values, on every path (forward, either backward, either
    sort, softmax): an output or gradient element is finite exactly where
    msda_reference's (fp64, rounded to its dtype) is; where it is not it may
    be NaN on one path and +-inf on another (IEEE arithmetic in other
    orders: 0 * inf and inf - inf are NaN).  A location outside its level
    (NaN, inf and huge ones too) samples zero: its gradient is 0, NaN
    where its weight or grad_output is inf or NaN.  Finite inputs overflow
    only where a float sum passes its dtype's range (the counting sort's
    integer sums: where the exact sum does).  docs/determinism.md,
    "Non-finite values".

    What is checked: shapes, dtypes and devices of every tensor,
    fp32_grad_accum and deterministic (None, True or False) and softmax (True
    or False), always.  The values of spatial_shapes and level_start_index
    only for CPU tensors in eager mode (ValueError unless every H_l, W_l >= 1,
    sum_l H_l * W_l = S and level_start_index is where each level starts).
    What is trusted on CUDA, where reading them would cost a host
    synchronisation: spatial_shapes (positive, covering S, with no
    H_l * W_l past int64).  Shapes that break this never read or write
    outside value and its gradient (the kernels mask every corner outside
    [0, S)) but give a wrong result.  level_start_index is not trusted: the
    kernels never see the one passed (a CPU one is checked first): each
    derives the starts from spatial_shapes as it runs.  Under torch.compile
    the values are checked on no device.
    """
    del im2col_step
    check_inputs(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
    fp32_grad_accum = check_optional_bool("fp32_grad_accum", fp32_grad_accum)
    deterministic = check_optional_bool("deterministic", deterministic)
    if not isinstance(softmax, bool):
        raise TypeError(f"softmax must be True or False, got {softmax!r}")
    if not _use_triton(value):  # the reference checks the level values it reads
        weights = point_softmax(attention_weights) if softmax else attention_weights
        return msda_reference(value, spatial_shapes, sampling_locations, weights,
                              level_start_index).to(value.dtype)
    check_levels(spatial_shapes, level_start_index, value.shape[1])
    spatial_shapes = spatial_shapes.contiguous()  # the kernels read (H, W) rows
    # level_start_index goes no further: a CUDA one that disagrees with the
    # shapes is invisible without a sync, so the kernels derive the starts.
    op = msda_forward if torch.compiler.is_compiling() else EagerMSDA.apply
    return op(value, spatial_shapes, sampling_locations, attention_weights, fp32_grad_accum,
              deterministic, softmax)
