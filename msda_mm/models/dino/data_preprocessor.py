"""mmdet's DetDataPreprocessor with the batch sent to the device in one copy
that does not wait.

mmengine's ``cast_data`` copies each image, each image's GT boxes and its
labels by a blocking copy of its own, and ``ImgDataPreprocessor`` swaps the
channels (``bgr_to_rgb``) with a Python-list index, copied to the device per
image: 4 waits per image.  Here every host
tensor ``cast_data`` would move goes in one pinned, non-blocking copy
(``one_copy.to_device``), but for tensors pinned already (the images from a
DataLoader with ``pin_memory=True``), each copied as it is without a wait;
the channels are swapped by a slice and a flip: the same tensors on the
device (dtype, values, box type), contiguous.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable, Iterator, List

import torch
from mmengine.structures import BaseDataElement
from torch import Tensor

from ... import compat  # noqa: F401  (first: on mmcv-lite, mmdet.models imports only after it)

# isort: split
from mmdet.models.data_preprocessors import DetDataPreprocessor
from mmdet.registry import MODELS
from mmdet.structures.bbox import BaseBoxes

from .one_copy import to_device

# Builds the moved structure from the moved tensors, taken in order.
Build = Callable[[Iterator[Tensor]], Any]


def _constant(value: Any) -> Build:
    return lambda moved: value


def _plan_tensor(t: Tensor, device: torch.device, host: List[Tensor]) -> Build:
    if t.device == device:  # Tensor.to returns it as it is
        return _constant(t)
    if t.device.type != "cpu":
        return lambda moved: t.to(device)
    if t.is_pinned():
        # Pinned already (a DataLoader with pin_memory=True, in its own thread): copied as it
        # is, no wait; packing it would copy its bytes on the host once more.
        return lambda moved: t.to(device, non_blocking=True)
    host.append(t)
    return lambda moved: next(moved)


def _plan_field(value: Any, device: torch.device, host: List[Tensor]) -> Build:
    """A data field as ``BaseDataElement.to`` moves it."""
    if isinstance(value, BaseBoxes):  # BaseBoxes.to: the same box type, not cloned
        tensor = _plan_tensor(value.tensor, device, host)
        return lambda moved: type(value)(tensor(moved), clone=False)
    if isinstance(value, (Tensor, BaseDataElement)):
        return plan_move(value, device, host)
    return lambda moved: value.to(device)


def plan_move(data: Any, device: torch.device, host: List[Tensor]) -> Build:
    """How mmengine's ``cast_data`` would move ``data`` to ``device``: the
    CPU tensors it would copy are appended to ``host``, and the returned
    function rebuilds ``data`` from those tensors moved."""
    if isinstance(data, Mapping):
        items = {key: plan_move(value, device, host) for key, value in data.items()}
        return lambda moved: {key: build(moved) for key, build in items.items()}
    if isinstance(data, (str, bytes)) or data is None:
        return _constant(data)
    if isinstance(data, Sequence):
        parts = [plan_move(value, device, host) for value in data]
        if isinstance(data, tuple) and hasattr(data, "_fields"):  # a namedtuple
            return lambda moved: type(data)(*(build(moved) for build in parts))
        return lambda moved: type(data)(build(moved) for build in parts)
    if isinstance(data, Tensor):
        return _plan_tensor(data, device, host)
    if isinstance(data, BaseDataElement):
        # BaseDataElement.to: a new element, its fields with a ``to`` moved.
        fields = {key: _plan_field(value, device, host) for key, value in data.items()
                  if hasattr(value, "to")}

        def build(moved: Iterator[Tensor]) -> BaseDataElement:
            new = data.new()
            for key, field in fields.items():
                new.set_data({key: field(moved)})
            return new
        return build
    return _constant(data)


@MODELS.register_module()
class SyncFreeDetDataPreprocessor(DetDataPreprocessor):
    """``DetDataPreprocessor`` whose ``cast_data`` moves the batch's host
    tensors (images, GT boxes and labels, any other tensor field) in one
    non-blocking copy from pinned memory, and whose channel swap copies no
    index: no wait on the device per image.  Same arguments and outputs as
    ``DetDataPreprocessor``; on a CPU device nothing is pinned or copied."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # mmengine swaps channels with ``x[[2, 1, 0], ...]``, whose index is
        # copied to the device per image: cast_data swaps them instead.
        self._swap_channels, self._channel_conversion = self._channel_conversion, False

    def cast_data(self, data: Any) -> Any:
        host: List[Tensor] = []
        build = plan_move(data, self.device, host)
        data = build(iter(to_device(host, self.device)))
        if self._swap_channels and isinstance(data, Mapping) and "inputs" in data:
            data = {**data, "inputs": _swapped_channels(data["inputs"])}
        return data


def _swapped_channels(inputs: Any) -> Any:
    """``inputs`` (a (C, H, W) tensor per image or one (N, C, H, W) tensor)
    with their first 3 channels in reverse order, as mmengine's
    ``x[[2, 1, 0], ...]`` (or ``x[:, [2, 1, 0], ...]``) gives them."""
    if isinstance(inputs, Tensor):
        return _swap(inputs, "inputs")
    if isinstance(inputs, Sequence) and all(isinstance(x, Tensor) for x in inputs):
        return [_swap(x, f"inputs[{i}]") for i, x in enumerate(inputs)]
    return inputs  # ImgDataPreprocessor.forward refuses it


def _swap(x: Tensor, name: str) -> Tensor:
    if x.dim() < 3 or x.shape[-3] < 3:
        raise ValueError(f"bgr_to_rgb/rgb_to_bgr swap 3 channels (dim -3); {name} has shape "
                         f"{tuple(x.shape)}")
    return x.narrow(-3, 0, 3).flip(-3)
