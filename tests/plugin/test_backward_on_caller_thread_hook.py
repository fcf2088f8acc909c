"""BackwardOnCallerThreadHook: the backward of a training step runs on the
thread of the training loop (autograd's multithreading off for that thread)
from before_train to after_train, and the previous mode comes back."""
import threading
import types

import pytest
import torch
from mmdet.registry import HOOKS

from msda_mm.engine import BackwardOnCallerThreadHook


class _Where(torch.autograd.Function):
    """Identity that records the thread its backward ran on."""
    threads = []

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _Where.threads.append(threading.get_ident())
        return grad


def _backward_thread(device) -> int:
    _Where.threads.clear()
    x = torch.ones(3, device=device, requires_grad=True)
    _Where.apply(x).sum().backward()
    return _Where.threads[-1]


def test_built_from_a_config_sets_and_restores_the_mode():
    hook = HOOKS.build(dict(type="BackwardOnCallerThreadHook"))
    assert isinstance(hook, BackwardOnCallerThreadHook)
    runner = types.SimpleNamespace()
    assert torch._C._is_multithreading_enabled()
    hook.before_train(runner)
    try:
        assert not torch._C._is_multithreading_enabled()
        assert _backward_thread("cpu") == threading.get_ident()
    finally:
        hook.after_train(runner)
    assert torch._C._is_multithreading_enabled()
    hook.after_train(runner)  # a second call (no before_train) changes nothing
    assert torch._C._is_multithreading_enabled()


@pytest.mark.gpu
def test_a_cuda_backward_moves_to_the_calling_thread():
    # Without the hook a CUDA backward runs on autograd's device thread
    # (on CPU it never leaves the caller, so only a GPU can show the move).
    me = threading.get_ident()
    assert _backward_thread("cuda") != me
    hook = BackwardOnCallerThreadHook()
    hook.before_train(None)
    try:
        assert _backward_thread("cuda") == me
    finally:
        hook.after_train(None)
    assert _backward_thread("cuda") != me
