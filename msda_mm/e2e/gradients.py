"""One training step's gradients with the MSDA op as configured and with
``fp32_compute``: does running the op on bf16 values change what a step
learns, beyond the op's own run-to-run noise?

The question comes from benchmarks/e2e/ap_b16: bf16 AMP trainings with the
op on bf16 values lagged far behind those with it computing in fp32, while
the kernels agree on the same values (tests/ops/test_msda_bf16_matches_fp32.py).
Three backward passes of one batch from the same weights and random state
answer it for a real model and batch: the op as configured twice (on CUDA
its atomics add in a different order each time: the noise floor) and with
``fp32_compute=True`` on every TritonMSDeformAttn.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator

import torch
from torch import nn

from ..models import TritonMSDeformAttn

PASSES = ("configured", "configured_again", "fp32_compute")


@contextmanager
def fp32_compute(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Every TritonMSDeformAttn of ``model`` with ``fp32_compute=enabled``
    inside the block, restored on exit."""
    modules = [m for m in model.modules() if isinstance(m, TritonMSDeformAttn)]
    saved = [m.fp32_compute for m in modules]
    for m in modules:
        m.fp32_compute = enabled
    try:
        yield
    finally:
        for m, value in zip(modules, saved):
            m.fp32_compute = value


def gradients(model: nn.Module, loss_fn: Callable[[], torch.Tensor],
              reseed: Callable[[], None]) -> tuple[float, dict[str, torch.Tensor]]:
    """(loss, {parameter name: fp32 gradient on the CPU}) of one backward of
    ``loss_fn()`` after ``reseed()`` (the same random draws every pass)."""
    model.zero_grad(set_to_none=True)
    reseed()
    loss = loss_fn()
    loss.backward()
    grads = {name: p.grad.detach().float().cpu() for name, p in model.named_parameters()
             if p.grad is not None}
    return loss.item(), grads


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / max(||a||, ||b||); 0 for two zero tensors."""
    scale = max(a.norm().item(), b.norm().item())
    return (a - b).norm().item() / scale if scale > 0 else 0.0


def compare(model: nn.Module, loss_fn: Callable[[], torch.Tensor],
            reseed: Callable[[], None]) -> dict:
    """The three passes (PASSES) and, per parameter, the relative difference
    of its gradient between the two configured passes (``floor``) and
    between the configured and the fp32_compute pass (``fp32_compute``)."""
    losses, grads = {}, {}
    for name in PASSES:
        with fp32_compute(model, True) if name == "fp32_compute" else nullcontext():
            losses[name], grads[name] = gradients(model, loss_fn, reseed)
    rows = [dict(parameter=p,
                 floor=relative_difference(grads["configured"][p],
                                           grads["configured_again"][p]),
                 fp32_compute=relative_difference(grads["configured"][p],
                                                  grads["fp32_compute"][p]))
            for p in grads["configured"]]
    rows.sort(key=lambda r: -r["fp32_compute"])
    return dict(losses=losses, parameters=rows, summary=_summary(rows))


def _summary(rows: list[dict]) -> dict:
    def median(values):
        values = sorted(values)
        return values[len(values) // 2] if values else None
    return {key: dict(median=median([r[key] for r in rows]),
                      max=max((r[key] for r in rows), default=None))
            for key in ("floor", "fp32_compute")}
