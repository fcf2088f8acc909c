"""The comparisons of a parity run: metrics, layer outputs, loss curves."""
from __future__ import annotations

import math
from numbers import Real

import torch

# mmdet rounds COCO metrics to 3 decimals (0.1 AP point); a difference of
# exactly the tolerance must not fail on the float error of the subtraction.
_ROUNDING = 1e-9


def metric_deltas(triton: dict, mmcv: dict) -> list[dict]:
    """One row per numeric metric both runs report: the values and their
    difference in AP points (mmdet's metrics are fractions: x 100)."""
    return [dict(metric=k, triton=triton[k], mmcv=mmcv[k], delta_ap=100.0 * (triton[k] - mmcv[k]))
            for k in triton
            if k in mmcv and isinstance(triton[k], Real) and isinstance(mmcv[k], Real)]


def within(delta: float, tolerance: float) -> bool:
    return math.isfinite(delta) and abs(delta) <= tolerance + _ROUNDING


def layer_diffs(triton: dict[str, list[torch.Tensor]],
                mmcv: dict[str, list[torch.Tensor]]) -> list[dict]:
    """Per MSDA module (in model order), over all its calls: the largest
    absolute difference of the outputs, and the largest absolute output of
    the mmcv side for scale."""
    if triton.keys() != mmcv.keys():
        raise ValueError(f"the runs called different attention modules: {sorted(triton)} vs "
                         f"{sorted(mmcv)}")
    rows = []
    for name, outputs in triton.items():
        if len(outputs) != len(mmcv[name]):
            raise ValueError(f"{name} ran {len(outputs)} times with triton and "
                             f"{len(mmcv[name])} times with mmcv")
        rows.append(dict(
            layer=name,
            max_abs_diff=max((a - b).abs().max().item() for a, b in zip(outputs, mmcv[name])),
            max_abs_mmcv=max(b.abs().max().item() for b in mmcv[name])))
    return rows


def relative_differences(triton: list[float], mmcv: list[float]) -> list[float]:
    """|triton - mmcv| / |mmcv| per iteration (inf where mmcv is 0 and
    triton is not)."""
    return [0.0 if a == b else abs(a - b) / abs(b) if b else math.inf
            for a, b in zip(triton, mmcv)]
