"""One training step of an mmdet detector, as the plugin tests take it."""
from __future__ import annotations

import contextlib

import torch


def finite_step(model: torch.nn.Module, batch: dict, autocast: str | None = None) -> dict:
    """The losses of ``model`` on ``batch`` (mmdet's packed inputs, moved to
    the model's device by its data preprocessor), after the backward of
    their sum; every loss asserted finite.  ``autocast``: the device type to
    run the forward under bf16 autocast on, or None."""
    data = model.data_preprocessor(batch, training=True)
    amp = (torch.autocast(autocast, dtype=torch.bfloat16) if autocast
           else contextlib.nullcontext())
    with amp:
        losses = model.loss(data["inputs"], data["data_samples"])
    total, _ = model.parse_losses(losses)
    total.backward()
    for name, value in losses.items():
        assert torch.isfinite(value).all(), name
    return losses
