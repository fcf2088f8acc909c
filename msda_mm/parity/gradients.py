"""One training step's gradients with the MSDA op as configured and with
``fp32_compute``: does running the op on bf16 values change what a step
learns, beyond the op's own run-to-run noise?

The kernels agree on the same values (tests/ops/test_msda_bf16_matches_fp32.py);
four backward passes of one batch from the same weights and random state
answer the question for a real model and batch, each TritonMSDeformAttn set
as follows: as configured, twice (on CUDA its atomics add in a different
order each time: the noise floor); with ``fp32_grad_accum=True`` (the
configured bf16 path may round grad_value in bf16 atomics: this pass takes
them out); and with ``fp32_compute=True``.  Compared per parameter: the
floor, configured against fp32_compute, and fp32_grad_accum against
fp32_compute (the op on bf16 against fp32 values, both accumulating in fp32:
equal up to the order of fp32 sums if the kernels are).

What the floor does not cover: the model's discrete steps (two-stage top-k
query selection, Hungarian matching) can amplify the op output's last-bit
differences, so a large fp32_compute difference does not by itself point at
the kernels; the control this comparison lacks is a pass perturbed as little
another way (e.g. the other forward kernel at the same dtype).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import nn

from ..models import TritonMSDeformAttn

# Pass name -> the TritonMSDeformAttn attribute it sets to True (None: as configured).
PASSES = {"configured": None, "configured_again": None, "fp32_grad_accum": "fp32_grad_accum",
          "fp32_compute": "fp32_compute"}
# Comparison name -> the two passes it compares.
COMPARISONS = {"floor": ("configured", "configured_again"),
               "fp32_compute": ("configured", "fp32_compute"),
               "bf16_value": ("fp32_grad_accum", "fp32_compute")}


@contextmanager
def attention_set(model: nn.Module, attribute: str | None) -> Iterator[None]:
    """Every TritonMSDeformAttn of ``model`` with ``attribute`` set to True
    inside the block (nothing if None), restored on exit."""
    modules = [m for m in model.modules() if isinstance(m, TritonMSDeformAttn)] \
        if attribute else []
    saved = [getattr(m, attribute) for m in modules]
    for m in modules:
        setattr(m, attribute, True)
    try:
        yield
    finally:
        for m, value in zip(modules, saved):
            setattr(m, attribute, value)


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
    """||a - b|| / max(||a||, ||b||); 0 for two zero tensors, NaN where
    either holds a NaN."""
    norms = (a.norm().item(), b.norm().item())
    if math.isnan(norms[0]) or math.isnan(norms[1]):
        return math.nan  # max() would keep or drop a NaN by argument order
    return 0.0 if max(norms) == 0 else (a - b).norm().item() / max(norms)


def compare(model: nn.Module, loss_fn: Callable[[], torch.Tensor],
            reseed: Callable[[], None]) -> dict:
    """The passes (PASSES): each one's loss and, per parameter, the relative
    difference of its gradient for each of COMPARISONS; parameters sorted by
    the fp32_compute comparison, largest first."""
    losses, grads = {}, {}
    for name, attribute in PASSES.items():
        with attention_set(model, attribute):
            losses[name], grads[name] = gradients(model, loss_fn, reseed)
    rows = [dict(parameter=p, **{key: relative_difference(grads[a][p], grads[b][p])
                                 for key, (a, b) in COMPARISONS.items()})
            for p in grads["configured"]]
    rows.sort(key=lambda r: -r["fp32_compute"])
    return dict(losses=losses, parameters=rows, summary=_summary(rows))


def _summary(rows: list[dict]) -> dict:
    def median(values):
        values = sorted(values)
        return values[len(values) // 2] if values else None
    return {key: dict(median=median([r[key] for r in rows]),
                      max=max((r[key] for r in rows), default=None))
            for key in COMPARISONS}
