"""CapturedSteps with a gradient reduction: it runs between backward and
update on the optimizer's gradients (CPU, eagerly), and on CUDA between
the two graphs' replays on the gradients the backward graph writes, the
same steps as run eagerly (GPU test); replays update with the learning
rates set since the capture (GPU test); eager warm-up steps hold the
memory of one step (GPU test); a failed capture names its key and
cause."""
from dataclasses import dataclass
from typing import List

import pytest
import torch
from torch import Tensor, nn

from msda_mm.engine import captured_steps
from msda_mm.engine.captured_steps import CapturedSteps


@dataclass
class ToyBatch:
    inputs: Tensor
    targets: Tensor

    @property
    def key(self):
        return tuple(self.inputs.shape)

    def copy_(self, other: "ToyBatch") -> "ToyBatch":
        self.inputs.copy_(other.inputs)
        self.targets.copy_(other.targets)
        return self


class ToyStep:
    """A linear regression's training step split as CapturedSteps takes it:
    backward logs the loss, update the clipped gradient norm; ``events``
    records the order of the parts."""

    def __init__(self, device: str) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(4, 3).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.1)
        self.events: List[str] = []

    def backward(self, batch: ToyBatch) -> Tensor:
        self.events.append("backward")
        loss = (self.model(batch.inputs) - batch.targets).square().mean()
        loss.backward()
        return loss.detach().reshape(1)

    def update(self) -> Tensor:
        self.events.append("update")
        norm = nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=1.0)
        self.optimizer.step()
        return norm.reshape(1)


def negate(grads: List[Tensor]) -> None:
    """A reduction that changes every gradient (its sign, which Adam's
    update follows where it ignores a scale), so that the tensors it acts
    on show in the parameters."""
    for grad in grads:
        grad.neg_()


def toy_batches(device: str, sizes) -> List[ToyBatch]:
    generator = torch.Generator().manual_seed(1)
    return [ToyBatch(torch.randn(n, 4, generator=generator).to(device),
                     torch.randn(n, 3, generator=generator).to(device)) for n in sizes]


def test_the_reduction_runs_between_backward_and_update_on_the_gradients():
    toy = ToyStep("cpu")
    seen = []

    def reduce(grads):
        toy.events.append("reduce")
        seen.append(grads)
        negate(grads)

    steps = CapturedSteps(toy.backward, toy.update, toy.optimizer, reduce=reduce)
    twin = ToyStep("cpu")
    (batch,) = toy_batches("cpu", [5])
    log = steps(batch, capture=False)
    assert toy.events == ["backward", "reduce", "update"]
    assert [g is p.grad for g, p in zip(seen[0], toy.model.parameters())] == [True, True]
    # The same step by hand: the gradients negated before clipping and the update.
    loss = twin.backward(batch)
    negate([p.grad for p in twin.model.parameters()])
    torch.testing.assert_close(log, torch.cat([loss, twin.update()]), rtol=0, atol=0)
    for p, q in zip(toy.model.parameters(), twin.model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_without_a_reduction_nothing_runs_in_between():
    toy = ToyStep("cpu")
    steps = CapturedSteps(toy.backward, toy.update, toy.optimizer)
    log = steps(toy_batches("cpu", [5])[0], capture=False)
    assert toy.events == ["backward", "update"] and log.shape == (2,)


@pytest.mark.gpu
def test_replays_reduce_the_gradients_their_backward_graph_writes():
    """Two keys, each captured after one eager step, then replayed in turn:
    another key's eager step and capture replace the parameters' .grad in
    between, and each replay still reduces its own backward graph's
    gradients, as the eager steps do."""
    if not torch.cuda.is_available():
        pytest.fail("GPU test run without CUDA")
    order = [2, 2, 3, 3, 2, 3, 2]
    runs = []
    for capture in (True, False):
        toy = ToyStep("cuda")
        steps = CapturedSteps(toy.backward, toy.update, toy.optimizer, reduce=negate)
        logs = [steps(batch, capture=capture).clone()
                for batch in toy_batches("cuda", order)]
        runs.append((torch.stack(logs), [p.detach().clone() for p in toy.model.parameters()],
                     steps.keys))
    (logs, params, keys), (eager_logs, eager_params, eager_keys) = runs
    assert keys == [(2, 4), (3, 4)] and eager_keys == []
    torch.testing.assert_close(logs, eager_logs, rtol=1e-5, atol=1e-6)
    for p, q in zip(params, eager_params):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_warm_up_steps_hold_the_memory_of_one_step():
    """Five eager warm-up steps of one key reserve no more memory than the
    first: they run on one side stream (the allocator keeps each stream's
    blocks apart, so a new stream a step reserves new blocks each step)."""
    if not torch.cuda.is_available():
        pytest.fail("GPU test run without CUDA")
    toy = ToyStep("cuda")
    steps = CapturedSteps(toy.backward, toy.update, toy.optimizer, warmup=5)
    batches = toy_batches("cuda", [4096] * 5)
    reserved = []
    for batch in batches:
        steps(batch, capture=True)
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
    assert steps.keys == []
    assert reserved == reserved[:1] * 5, reserved


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_replays_update_with_the_learning_rates_set_since_the_capture(fused):
    """Two parameter groups whose learning rates change before every step,
    as a warm-up and a decay change them: each replay of the one captured
    key updates with the rates set before it, as the same steps run
    eagerly do (a replay that kept the capture's rates would move the
    parameters 10 to 100 times too far or too little)."""
    if not torch.cuda.is_available():
        pytest.fail("GPU test run without CUDA")
    rates = [(0.1 * (i + 1) / 6, 0.01 * (i + 1) / 6) for i in range(6)] + [(1e-3, 1e-4)] * 2
    runs = []
    for capture in (True, False):
        toy = ToyStep("cuda")
        weight, bias = toy.model.weight, toy.model.bias
        toy.optimizer = torch.optim.AdamW([dict(params=[weight]), dict(params=[bias])],
                                          lr=0.1, weight_decay=0.05, fused=fused)
        steps = CapturedSteps(toy.backward, toy.update, toy.optimizer)
        params = []
        for batch, lrs in zip(toy_batches("cuda", [3] * len(rates)), rates):
            for group, lr in zip(toy.optimizer.param_groups, lrs):
                group["lr"] = lr
            steps(batch, capture=capture)
            params.append(torch.cat([weight.detach().flatten(), bias.detach()]))
        runs.append((torch.stack(params), steps.keys))
    (params, keys), (eager_params, eager_keys) = runs
    assert keys == [(3, 4)] and eager_keys == []
    torch.testing.assert_close(params, eager_params, rtol=1e-5, atol=1e-6)


class _FailingCapture:
    """Stands in for torch.cuda.graph: the capture fails as it ends, as
    CUDA reports an invalidated capture; ``retries`` of the allocator's
    out-of-memory retries happen meanwhile."""

    def __init__(self, stats: dict, retries: int) -> None:
        self.stats, self.retries = stats, retries

    def __call__(self, graph, pool=None, capture_error_mode="global"):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stats["num_alloc_retries"] += self.retries
        raise torch.AcceleratorError("CUDA error: operation failed due to a previous error "
                                     "during capture")


@pytest.mark.parametrize("retries, why", [
    (2, "PyTorch.s allocator ran out of GPU memory 2 time\\(s\\) during the capture"),
    (0, "AcceleratorError: CUDA error: operation failed due to a previous error"),
])
def test_a_failed_capture_names_its_key_and_cause(monkeypatch, retries, why):
    """A capture that fails says which shape key's, and, where the
    allocator ran out of memory meanwhile (its cache freed, which ends a
    capture), that cause; otherwise CUDA's error."""
    stats = {"num_alloc_retries": 5}
    monkeypatch.setattr(captured_steps.torch.cuda, "CUDAGraph", lambda: None)
    monkeypatch.setattr(captured_steps.torch.cuda, "memory_stats", lambda device: stats)
    monkeypatch.setattr(captured_steps.torch.cuda, "graph", _FailingCapture(stats, retries))
    with pytest.raises(captured_steps.CaptureError,
                       match=f"shape key \\(2, 4\\) failed: {why}.*start the run anew"):
        captured_steps.capture_graph(lambda: torch.zeros(1), None, torch.device("cpu"), (2, 4))
