"""``TritonMSDeformAttn``: mmcv's ``MultiScaleDeformableAttention`` on msda_mm's op.

It subclasses mmcv's class and replaces only ``forward``, which is why:
  * constructor, parameter names, state_dict and ``init_weights`` (zero
    ``sampling_offsets`` weight with the per-head grid bias, zero
    ``attention_weights``, Xavier projections) are mmcv's own, so mmcv
    checkpoints load with ``strict=True``;
  * ``isinstance(m, MultiScaleDeformableAttention)`` holds, so
    ``DeformableDETR.init_weights`` and ``DINO.init_weights`` re-initialise
    it exactly as they do mmcv's module, without patching mmdet.
"""
from __future__ import annotations

import inspect
from numbers import Integral
from typing import Optional

import torch
from mmengine.utils import deprecated_api_warning
from torch import Tensor

from .. import compat  # noqa: F401  (first: on mmcv-lite, mmcv.ops imports only after it)

# isort: split
from mmcv.ops import MultiScaleDeformableAttention
from mmdet.registry import MODELS

from ..ops import multi_scale_deformable_attention
from ..ops.validate import check_optional_bool


def _mmcv_arguments(args: tuple, kwargs: dict) -> dict:
    """Every argument of mmcv's constructor by name, defaults filled in."""
    bound = inspect.signature(MultiScaleDeformableAttention.__init__).bind(None, *args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def _check_sizes(embed_dims, num_heads, num_levels, num_points, value_proj_ratio,
                 **_) -> None:
    """TypeError/ValueError naming the size argument that cannot build the
    module (mmcv's own constructor fails on num_heads=0 with a
    ZeroDivisionError, on num_levels=0 in init_weights, naming neither)."""
    sizes = dict(embed_dims=embed_dims, num_heads=num_heads, num_levels=num_levels,
                 num_points=num_points)
    for name, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, Integral):
            raise TypeError(f"{name} must be an int, got {size!r}")
        if size < 1:
            raise ValueError(f"{name} must be at least 1, got {size}")
    value_dims = int(embed_dims * value_proj_ratio)
    for name, dims in (("embed_dims", embed_dims), ("embed_dims * value_proj_ratio", value_dims)):
        if dims % num_heads or dims < 1:
            raise ValueError(f"{name} = {dims} must be a positive multiple of num_heads = "
                             f"{num_heads}")


def _location_dtype(reference_points: Tensor) -> torch.dtype:
    # At least fp32, whatever dtype the reference points and the (autocast
    # bf16/fp16) offsets arrive in: a bf16 location in [0, 1] is only good to
    # 1/256 of the image, about a pixel on a 200-wide level.  fp64 stays.
    return torch.promote_types(reference_points.dtype, torch.float32)


@MODELS.register_module()
class TritonMSDeformAttn(MultiScaleDeformableAttention):
    """Multi-scale deformable attention (Deformable DETR) whose sampling runs
    in msda_mm's Triton kernels on CUDA (PyTorch reference on CPU).

    Same arguments as ``mmcv.ops.MultiScaleDeformableAttention``: embed_dims,
    num_heads, num_levels, num_points, im2col_step (unused by the kernels),
    dropout, batch_first, norm_cfg, init_cfg, value_proj_ratio; and
    fp32_grad_accum, the op's choice of grad_value accumulation (None: per
    device; True/False force fp32 scratch or native atomics), so a config
    can run the pre-Hopper bf16 path on an H100/H200; deterministic, the
    op's choice of a bitwise-reproducible backward (None: follow
    ``torch.use_deterministic_algorithms``; True: always, grad_value summed
    per value row without atomics; False: float atomics, docs/determinism.md);
    and fp32_compute: run the op on an fp32 copy of the projected value (its
    output and grad_value fp32 too; locations and weights are fp32 anyway),
    as mmcv's ``grid_sample`` path does under autocast, at the fp32 kernels'
    cost.  The output goes back to the projection's dtype before
    output_proj, which under autocast rounds it there anyway and in a half
    model takes half.  fp32_compute does not make bf16 training more
    reliable: the bf16 and fp32 kernels compute the same on the same values
    (tests/ops/test_msda_bf16_matches_fp32.py), and bf16 DINO trainings from
    scratch without an LR warmup lagged fp32 at random with the op on bf16
    values or in fp32 alike (docs/training.md).  All three are plain
    attributes: state_dict and checkpoints are unchanged.

    Forward does no host synchronisation: mmcv's check that spatial_shapes
    cover the value sequence (a device-to-host read) is left to the op, which
    checks it for CPU shapes only.

    The attention weights' softmax over the L * K points of each head, a
    separate ``.softmax(-1)`` in mmcv, runs inside the op's forward kernel
    (``softmax=True``, docs/fused_softmax.md): the module hands the op the
    raw logits of ``attention_weights``.  The result is mmcv's under
    autocast, where that softmax runs in fp32 (so does the fused one); a
    half model without autocast gets an fp32 softmax where mmcv's would
    round the weights to 16 bits.  No switch: outputs, gradients and
    state_dict are mmcv's either way.
    """

    def __init__(self, *args, fp32_grad_accum: Optional[bool] = None,
                 fp32_compute: bool = False, deterministic: Optional[bool] = None, **kwargs):
        if not isinstance(fp32_compute, bool):
            raise TypeError(f"fp32_compute must be True or False, got {fp32_compute!r}")
        fp32_grad_accum = check_optional_bool("fp32_grad_accum", fp32_grad_accum)
        deterministic = check_optional_bool("deterministic", deterministic)
        _check_sizes(**_mmcv_arguments(args, kwargs))
        super().__init__(*args, **kwargs)
        self.fp32_grad_accum = fp32_grad_accum
        self.fp32_compute = fp32_compute
        self.deterministic = deterministic

    @deprecated_api_warning({"residual": "identity"}, cls_name="TritonMSDeformAttn")
    def forward(self,
                query: Tensor,
                key: Optional[Tensor] = None,
                value: Optional[Tensor] = None,
                identity: Optional[Tensor] = None,
                query_pos: Optional[Tensor] = None,
                key_padding_mask: Optional[Tensor] = None,
                reference_points: Optional[Tensor] = None,
                spatial_shapes: Optional[Tensor] = None,
                level_start_index: Optional[Tensor] = None,
                **kwargs) -> Tensor:
        """Attend from each query to points sampled around its reference point.

        Shapes for ``batch_first=True`` (else the first two dims swap in
        query, value, identity, query_pos and the result):

        Args:
            query: (B, Q, C), C = embed_dims.
            key: unused (the keys are the sampled values), as in mmcv.
            value: (B, S, C), S = sum_l H_l * W_l; None means query.
            identity: (B, Q, C) added to the output (residual); None means
                query before query_pos is added.
            query_pos: (B, Q, C) added to query, or None.
            key_padding_mask: (B, S) bool, True where value is padding.
            reference_points: (B, Q, L, 2) normalised (x, y) points, or
                (B, Q, L, 4) (x, y, w, h) boxes that scale the offsets.
            spatial_shapes: (L, 2) int (H_l, W_l).
            level_start_index: (L,) int start of each level in S, or None.

        Returns:
            (B, Q, C): ``dropout(output_proj(attention)) + identity``.
        """
        if reference_points is None or spatial_shapes is None:
            raise ValueError("TritonMSDeformAttn needs reference_points and spatial_shapes")
        if value is None:
            value = query
        if identity is None:
            identity = query
        if query_pos is not None:
            query = query + query_pos
        if not self.batch_first:
            query, value = query.transpose(0, 1), value.transpose(0, 1)
        if query.shape[:2] != reference_points.shape[:2]:
            layout = "(B, Q, C)" if self.batch_first else "(Q, B, C)"
            raise ValueError(
                f"TritonMSDeformAttn(batch_first={self.batch_first}) takes query as {layout}, "
                f"which gives (B, Q) = {tuple(query.shape[:2])}, but reference_points "
                f"(B, Q, L, 2|4) has {tuple(reference_points.shape[:2])}")

        value = self._project_value(value, key_padding_mask)
        projected_dtype = value.dtype
        if self.fp32_compute:
            value = value.to(torch.promote_types(projected_dtype, torch.float32))
        locations, logits = self._sampling_points(query, reference_points, spatial_shapes)
        output = multi_scale_deformable_attention(value, spatial_shapes, level_start_index,
                                                  locations, logits, softmax=True,
                                                  fp32_grad_accum=self.fp32_grad_accum,
                                                  deterministic=self.deterministic)
        output = self.output_proj(output.to(projected_dtype))
        if not self.batch_first:
            output = output.transpose(0, 1)
        return self.dropout(output) + identity

    def _project_value(self, value: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
        """(B, S, C) -> (B, S, M, D); padded positions zeroed.  Kept in the
        projection's dtype (bf16 under autocast): the kernels read it as is
        (unless fp32_compute, see forward)."""
        value = self.value_proj(value)
        if key_padding_mask is not None:
            value = value.masked_fill(key_padding_mask[..., None], 0.0)
        return value.unflatten(-1, (self.num_heads, -1))

    def _sampling_points(self, query: Tensor, reference_points: Tensor,
                         spatial_shapes: Tensor) -> tuple[Tensor, Tensor]:
        """Sampling locations (B, Q, M, L, K, 2), at least fp32, and attention
        logits (B, Q, M, L, K) from query (B, Q, C); the op takes their softmax."""
        M, L, K = self.num_heads, self.num_levels, self.num_points
        offsets = self.sampling_offsets(query).unflatten(-1, (M, L, K, 2))
        logits = self.attention_weights(query).unflatten(-1, (M, L, K))

        dtype = _location_dtype(reference_points)
        offsets = offsets.to(dtype)
        ref = reference_points.to(dtype)[:, :, None, :, None, :]  # (B, Q, 1, L, 1, 2|4)
        if reference_points.shape[-1] == 2:
            # Offsets are in pixels of each level: normalise by its (W, H).
            level_wh = spatial_shapes.flip(-1).to(dtype)[:, None, :]  # (L, 1, 2)
            locations = ref + offsets / level_wh
        elif reference_points.shape[-1] == 4:
            # Offsets are relative to the box: K points span half its size.
            locations = ref[..., :2] + offsets / K * ref[..., 2:] * 0.5
        else:
            raise ValueError("reference_points must end in 2 (x, y) or 4 (x, y, w, h), got "
                             f"shape {tuple(reference_points.shape)}")
        return locations, logits
