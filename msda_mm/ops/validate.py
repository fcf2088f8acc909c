"""Input checks for the MSDA op: clear Python exceptions naming the argument
and what was seen, instead of asserts, CUDA faults or silent garbage.

Only metadata is inspected (shapes, dtypes, devices), never values of device
tensors, so checking costs no host synchronisation.  The level values
(spatial_shapes, level_start_index) are read only where that is free: CPU
tensors in eager mode (check_levels).
"""
from __future__ import annotations

from itertools import accumulate

import numpy as np
import torch

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INTS = (torch.int32, torch.int64)


def _check_float(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")


def _check_int(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _INTS:
        raise TypeError(f"{name} must be an int32 or int64 tensor, got {t.dtype}")


def _valid(value, spatial_shapes, level_start_index, sampling_locations,
           attention_weights) -> bool:
    """Whether check_inputs' checks all pass, asked in one expression: the
    calls of a model take this path alone (a third of the checks' host time),
    and only a call that fails one takes the checks that say which."""
    tensor = torch.Tensor
    if not (isinstance(value, tensor) and isinstance(sampling_locations, tensor)
            and isinstance(attention_weights, tensor) and isinstance(spatial_shapes, tensor)
            and (level_start_index is None or isinstance(level_start_index, tensor))):
        return False
    shape = sampling_locations.shape
    device = value.device
    return (value.dtype in _FLOATS and sampling_locations.dtype in _FLOATS
            and attention_weights.dtype in _FLOATS and spatial_shapes.dtype in _INTS
            and (level_start_index is None or level_start_index.dtype in _INTS)
            and value.dim() == 4 and len(shape) == 6 and shape[5] == 2
            and shape[0] == value.shape[0] and shape[2] == value.shape[2]
            and attention_weights.shape == shape[:5] and spatial_shapes.shape == (shape[3], 2)
            and (level_start_index is None or level_start_index.shape == (shape[3],))
            and shape[3] != 0 and shape[4] != 0
            and spatial_shapes.device == device and sampling_locations.device == device
            and attention_weights.device == device
            and (level_start_index is None or level_start_index.device == device))


def check_inputs(value, spatial_shapes, level_start_index, sampling_locations,
                 attention_weights) -> None:
    """Raise TypeError/ValueError unless the arguments form a valid MSDA call.

    value (B, S, M, D); spatial_shapes (L, 2) int; level_start_index (L,) int
    or None; sampling_locations (B, Q, M, L, K, 2); attention_weights
    (B, Q, M, L, K).
    """
    if _valid(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
        return
    _check_float("value", value)
    _check_float("sampling_locations", sampling_locations)
    _check_float("attention_weights", attention_weights)
    _check_int("spatial_shapes", spatial_shapes)
    if level_start_index is not None:
        _check_int("level_start_index", level_start_index)

    if value.dim() != 4:
        raise ValueError(f"value must be (B, S, M, D), got shape {tuple(value.shape)}")
    if sampling_locations.dim() != 6 or sampling_locations.shape[-1] != 2:
        raise ValueError("sampling_locations must be (B, Q, M, L, K, 2), got shape "
                         f"{tuple(sampling_locations.shape)}")
    if attention_weights.dim() != 5:
        raise ValueError("attention_weights must be (B, Q, M, L, K), got shape "
                         f"{tuple(attention_weights.shape)}")
    if spatial_shapes.dim() != 2 or spatial_shapes.shape[1] != 2:
        raise ValueError(f"spatial_shapes must be (L, 2), got shape {tuple(spatial_shapes.shape)}")

    B, S, M, D = value.shape
    Bl, Q, Ml, L, K, _ = sampling_locations.shape
    if (Bl, Ml) != (B, M):
        raise ValueError(
            f"sampling_locations {tuple(sampling_locations.shape)} disagrees with value "
            f"{tuple(value.shape)} on batch B or heads M")
    if tuple(attention_weights.shape) != (B, Q, M, L, K):
        raise ValueError(
            f"attention_weights must be (B, Q, M, L, K) = {(B, Q, M, L, K)} to match "
            f"sampling_locations {tuple(sampling_locations.shape)}, got "
            f"{tuple(attention_weights.shape)}")
    if spatial_shapes.shape[0] != L:
        raise ValueError(f"spatial_shapes has {spatial_shapes.shape[0]} levels but "
                         f"sampling_locations {tuple(sampling_locations.shape)} has L={L}")
    if level_start_index is not None and tuple(level_start_index.shape) != (L,):
        raise ValueError(f"level_start_index must be ({L},), got shape "
                         f"{tuple(level_start_index.shape)}")
    if L == 0 or K == 0:
        raise ValueError(f"need at least one level and one point, got L={L}, K={K}")

    tensors = {"value": value, "spatial_shapes": spatial_shapes,
               "sampling_locations": sampling_locations, "attention_weights": attention_weights}
    if level_start_index is not None:
        tensors["level_start_index"] = level_start_index
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError("all tensors must be on one device, got "
                         + ", ".join(f"{n}: {d}" for n, d in devices.items()))


def check_optional_bool(name: str, flag):
    """``flag`` as the op takes it: None, True or False (a numpy bool becomes
    a bool), or TypeError: any other value, even a truthy string such as
    'no', would otherwise silently mean True."""
    if flag is None or isinstance(flag, bool):
        return flag
    if isinstance(flag, np.bool_):
        return bool(flag)
    raise TypeError(f"{name} must be None, True or False, got {flag!r}")


def level_starts(shapes: list) -> list:
    """Where each level of ``shapes`` ([H, W] per level) starts in S."""
    return list(accumulate((h * w for h, w in shapes[:-1]), initial=0))


def check_level_values(shapes: list, starts: list | None, S: int) -> None:
    """ValueError unless ``shapes`` (spatial_shapes as [H, W] per level) are
    positive, tile value's S positions, and agree with ``starts``
    (level_start_index, or None).  Python ints: an H * W past int64, which
    wraps in a tensor, is seen here as the number it is."""
    if any(h < 1 or w < 1 for h, w in shapes):
        raise ValueError(f"spatial_shapes must hold positive (H, W) per level, got {shapes}")
    total = sum(h * w for h, w in shapes)
    if total != S:
        raise ValueError(f"spatial_shapes {shapes} cover {total} positions but value has S={S}")
    if starts is not None and starts != level_starts(shapes):
        raise ValueError(f"level_start_index {starts} disagrees with spatial_shapes {shapes}, "
                         f"whose levels start at {level_starts(shapes)}")


def check_levels(spatial_shapes: torch.Tensor, level_start_index: torch.Tensor | None,
                 S: int) -> None:
    """check_level_values for CPU tensors in eager mode, where reading them
    costs no device synchronisation (CUDA tensors: see
    multi_scale_deformable_attention); under torch.compile the values are
    unknown while tracing, so nothing is read (no graph break)."""
    if spatial_shapes.device.type != "cpu" or torch.compiler.is_compiling():
        return
    check_level_values(spatial_shapes.tolist(),
                       None if level_start_index is None else level_start_index.tolist(), S)
