"""EagerPlans: the eager op's launch plans, made once per call signature and
the same as plan_forward's and plan_backward's; whatever the plans read
(shapes, strides, dtypes, value's alignment, softmax, tiles, accumulator)
takes a plan of its own."""
import pytest
import torch

from msda_mm import multi_scale_deformable_attention as msda
from msda_mm.ops import eager_plans
from msda_mm.ops.backward.launcher import plan_backward
from msda_mm.ops.eager_plans import EagerPlans
from msda_mm.ops.forward.launcher import plan_forward
from msda_mm.ops.tiles import TUNED, Tiles, tile_override

from msda_inputs import make_inputs


def _inputs(B=2, S=10, Q=6, M=2, D=8, L=2, K=2, dtype=torch.float32, device="meta"):
    return (torch.empty(B, S, M, D, dtype=dtype, device=device),
            torch.empty(B, Q, M, L, K, 2, device=device),
            torch.empty(B, Q, M, L, K, device=device))


@pytest.fixture
def planned(monkeypatch):
    """Counts plan_forward's and plan_backward's calls through EagerPlans."""
    calls = []
    for name, fn in (("plan_forward", plan_forward), ("plan_backward", plan_backward)):
        monkeypatch.setattr(eager_plans, name,
                            lambda *args, fn=fn, name=name, **kw: calls.append(name)
                            or fn(*args, **kw))
    return calls


def test_a_signature_is_planned_once_with_the_launchers_plans(planned):
    plans = EagerPlans()
    value, loc, attn = _inputs()
    plan = plans.get(value, loc, attn, False, TUNED, False)
    assert plans.get(*_inputs(), False, TUNED, False) is plan
    assert planned == ["plan_backward", "plan_forward"]
    assert plan == (plan_forward(value, loc, attn, False, TUNED),
                    plan_backward(value, loc, attn, False, tiles=TUNED), TUNED)


def test_deterministic_calls_plan_the_forward_only(planned):
    plan = EagerPlans().get(*_inputs(), False, TUNED, None)
    assert plan.backward is None and planned == ["plan_forward"]


def test_what_the_plans_read_takes_a_plan_of_its_own(planned):
    plans = EagerPlans()
    value, loc, attn = _inputs()
    base = plans.get(value, loc, attn, False, TUNED, False)
    others = [
        plans.get(value, loc, attn, True, TUNED, False),  # softmax
        plans.get(value, loc, attn, False, TUNED, True),  # fp32 accumulator
        plans.get(value, loc, attn, False, Tiles(bwd=(2, 1, 8)), False),
        plans.get(value.double(), loc, attn, False, TUNED, False),
        plans.get(value, loc.half(), attn, False, TUNED, False),
        plans.get(value, loc, attn.double(), False, TUNED, False),
        plans.get(*_inputs(Q=7), False, TUNED, False),
        plans.get(*_inputs(D=16), False, TUNED, False),
        # The same shapes in other strides.
        plans.get(value.transpose(1, 2).contiguous().transpose(1, 2), loc, attn, False, TUNED,
                  False),
        plans.get(value, loc.transpose(1, 2).contiguous().transpose(1, 2), attn, False, TUNED,
                  False),
        plans.get(value, loc, attn.transpose(1, 2).contiguous().transpose(1, 2), False, TUNED,
                  False),
    ]
    assert len(planned) == 2 * (1 + len(others))
    assert plans.get(value, loc, attn, False, TUNED, False) is base


def test_value_alignment_decides_the_pairs_kernel():
    # 64k (batch, query, head) rows: msda_fwd_pairs_kernel where value's rows
    # are whole int32 words, which a value one bf16 element off is not.
    B, S, Q, M, D = 1, 4, 8192, 8, 32
    _, loc, attn = _inputs(B=B, S=S, Q=Q, M=M, D=D, L=1, K=1, device="cpu")
    storage = torch.empty(B * S * M * D + 1, dtype=torch.bfloat16)
    aligned = storage[:-1].view(B, S, M, D)
    off = storage[1:].view(B, S, M, D)
    plans = EagerPlans()
    assert plans.get(aligned, loc, attn, False, TUNED, False).forward.pairs
    assert not plans.get(off, loc, attn, False, TUNED, False).forward.pairs


def test_the_cache_starts_over_when_full(monkeypatch, planned):
    monkeypatch.setattr(EagerPlans, "MAX_PLANS", 2)
    plans = EagerPlans()
    for Q in (1, 2, 3):
        plans.get(*_inputs(Q=Q), False, TUNED, None)
    assert len(plans.kept) == 1 and len(planned) == 3


def test_the_eager_op_plans_once_per_signature_and_tile_policy(planned):
    args = make_inputs(B=1, Q=3, M=2, D=4, K=2)[0]
    first = msda(**args)
    # Each block sets a policy of its own, which no other call has planned for.
    for _ in range(2):
        planned.clear()
        with tile_override(fwd=(1, 1, 4)):
            assert torch.equal(msda(**args), first)
            assert torch.equal(msda(**args), first)
        assert planned == ["plan_backward", "plan_forward"]
