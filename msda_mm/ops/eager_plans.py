"""The eager op's launch plans, kept per call signature.

The forward's plan (forward/launcher.py's plan_forward) and the float-atomic
backward's (backward/launcher.py's plan_backward) depend on nothing but the
inputs' shapes, strides and dtypes, value's alignment, the softmax flag, the
tile policy and grad_value's accumulator: a model calls the op with few such
signatures, so ``EagerPlans`` makes each plan once and the eager op only
looks it up (docs/design.md).
"""
from __future__ import annotations

from typing import NamedTuple

from .backward.launcher import BackwardPlan, plan_backward
from .forward.launcher import ForwardPlan, plan_forward
from .tiles import Tiles


class EagerPlan(NamedTuple):
    forward: ForwardPlan
    backward: BackwardPlan | None  # None: the deterministic backward, planned as it runs
    tiles: Tiles  # held, so that no other policy takes its id while the plan is kept


class EagerPlans:
    """``EagerPlans().get(...)`` is the plans of a non-empty call, made on the
    first call of its signature and kept."""

    # Plans kept; past this many (shapes that keep changing, such as an
    # encoder fed ever other image sizes) the cache starts over.
    MAX_PLANS = 1024

    def __init__(self):
        self.kept: dict = {}

    def get(self, value, sampling_locations, attention_weights, softmax: bool, tiles: Tiles,
            fp32_grad_accum: bool | None) -> EagerPlan:
        """The plans for these inputs (validated, non-empty) and ``tiles``;
        ``fp32_grad_accum``: resolved (resolve_fp32_grad_accum), or None for
        the deterministic backward (no backward plan).  What the key holds:
        everything the plans read (attention_weights' shape is the
        locations' first five dimensions); value's data pointer modulo 16
        decides whether its rows are whole words (runtime.channel_pairs);
        the policy by identity (a frozen dataclass's hash costs a
        microsecond)."""
        key = (value.shape, value.stride(), value.dtype, value.data_ptr() & 15,
               sampling_locations.shape, sampling_locations.stride(), sampling_locations.dtype,
               attention_weights.stride(), attention_weights.dtype, softmax, id(tiles),
               fp32_grad_accum)
        plan = self.kept.get(key)
        if plan is None:
            backward = None if fp32_grad_accum is None else plan_backward(
                value, sampling_locations, attention_weights, fp32_grad_accum,
                softmax=softmax, tiles=tiles)
            plan = EagerPlan(plan_forward(value, sampling_locations, attention_weights, softmax,
                                          tiles), backward, tiles)
            if len(self.kept) >= self.MAX_PLANS:
                self.kept.clear()
            self.kept[key] = plan
        return plan
