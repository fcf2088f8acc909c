"""msda_mm.engine.keep_fp32: chosen submodules run in fp32 under autocast
(CPU autocast here; CUDA's is the same mechanism, tests/plugin's GPU test)."""
import copy

import pytest
import torch
from torch import nn

from msda_mm.engine import keep_fp32


class Net(nn.Module):
    """A trunk, and a head whose parts are called directly (as DINO calls
    bbox_head.cls_branches[i]) and through the head's own forward."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(8, 8)
        self.head = Head()

    def forward(self, x):
        h = self.trunk(x)
        return h, self.head.branches[0](h), self.head(h, extra={"skip": [h]})


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.branches = nn.ModuleList([nn.Linear(8, 3), nn.Sequential(nn.Linear(8, 8), nn.ReLU(),
                                                                      nn.Linear(8, 2))])

    def forward(self, h, extra):
        # The nested argument must arrive in fp32 too: a bf16 tensor added to
        # an fp32 result would otherwise stay unnoticed.
        assert extra["skip"][0].dtype == h.dtype
        return self.branches[1](h) + extra["skip"][0][:, :2]


def _bf16_autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _dtypes(outputs):
    return [o.dtype for o in outputs]


def test_kept_modules_run_in_fp32_and_the_rest_in_bf16():
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    with _bf16_autocast():
        assert _dtypes(net(x)) == [torch.bfloat16] * 3
    keep_fp32(net, ["head"])
    with _bf16_autocast():
        trunk, direct, through_forward = net(x)
        assert torch.is_autocast_enabled("cpu")  # the hooks gave it back
    assert _dtypes([trunk, direct, through_forward]) == [torch.bfloat16, torch.float32,
                                                        torch.float32]
    # The head computed in fp32 on the (bf16) trunk output: the fp32 result of
    # the same input, not a bf16 one cast up.
    want = net.head.branches[0](trunk.float())
    assert torch.equal(direct, want)


def test_without_autocast_the_hooks_change_nothing():
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    before = net(x)
    keep_fp32(net, ["head"])
    after = net(x)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert _dtypes(net.double()(x.double())) == [torch.float64] * 3


def test_deep_copies_keep_the_behaviour_and_removing_the_handles_undoes_it():
    net, x = Net(), torch.randn(4, 8)
    handles = keep_fp32(net, ["head"])
    clone = copy.deepcopy(net)  # as an EMA hook copies a model
    with _bf16_autocast():
        assert _dtypes(clone(x)) == [torch.bfloat16, torch.float32, torch.float32]
    for handle in handles:
        handle.remove()
    with _bf16_autocast():
        assert _dtypes(net(x)) == [torch.bfloat16] * 3


def test_an_exception_inside_a_kept_module_gives_autocast_back():
    net = Net()
    keep_fp32(net, ["head"])
    with _bf16_autocast():
        with pytest.raises(RuntimeError):
            net.head.branches[0](torch.randn(4, 5))  # wrong width
        assert torch.is_autocast_enabled("cpu")
        assert net.trunk(torch.randn(4, 8)).dtype == torch.bfloat16


def test_fp64_arguments_stay_fp64():
    # Autocast leaves fp64 alone; so do the hooks.
    class Identity(nn.Module):
        def forward(self, x):
            return x

    module = Identity()
    keep_fp32(module, [""])
    with _bf16_autocast():
        assert module(torch.zeros(2, dtype=torch.float64)).dtype == torch.float64
        assert module(torch.zeros(2, dtype=torch.bfloat16)).dtype == torch.float32


class Recursive(nn.Module):
    """Calls itself once; the inner call is refused by a pre-hook of the
    model's own (registered before keep_fp32's), and the outer call goes on."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, depth=0):
        if depth == 0:
            with pytest.raises(RuntimeError, match="refused"):
                self(x, depth=1)
        # Not through self.lin, whose own hooks would turn autocast off again.
        return nn.functional.linear(x, self.lin.weight, self.lin.bias)


def test_a_refused_inner_call_leaves_the_outer_call_in_fp32():
    module = Recursive()

    def refuse_inner(mod, args, kwargs):
        if kwargs.get("depth"):
            raise RuntimeError("refused")

    module.register_forward_pre_hook(refuse_inner, with_kwargs=True)
    keep_fp32(module, [""])
    with _bf16_autocast():
        assert module(torch.randn(2, 4)).dtype == torch.float32
        assert torch.is_autocast_enabled("cpu")
        assert module.lin(torch.randn(2, 4)).dtype == torch.float32  # still kept


def test_overlapping_names_hook_each_module_once():
    net = Net()
    handles = keep_fp32(net, ["head", "head.branches.1"])
    modules_under_head = len(list(net.head.modules()))
    assert len(handles) == 2 * modules_under_head


def test_bad_names_are_refused():
    with pytest.raises(ValueError, match=r"Net has no submodule 'heads' \(its children: "
                                         r"\['head', 'trunk'\]\)"):
        keep_fp32(Net(), ["heads"])
    with pytest.raises(TypeError, match="list of submodule paths, got the string 'head'"):
        keep_fp32(Net(), "head")
    # Every path is checked before any module is hooked.
    net = Net()
    with pytest.raises(ValueError, match="no submodule 'heads'"):
        keep_fp32(net, ["head", "heads"])
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in net.modules())
