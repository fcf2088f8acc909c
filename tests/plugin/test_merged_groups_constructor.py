"""MergedGroupsOptimWrapperConstructor: mmengine's paramwise groups, one per
distinct set of options, and the same training step."""
import copy

import pytest
import torch
from mmdet.registry import OPTIM_WRAPPER_CONSTRUCTORS
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope
from torch import nn

from msda_mm.engine import MergedGroupsOptimWrapperConstructor
from msda_mm.engine.merged_groups_constructor import merge_param_groups

# mmdet's DINO optimizer (configs/dino_fp32.py's base), plus decay mults so
# that biases and norms get options of their own.
CFG = dict(optimizer=dict(type="AdamW", lr=1e-4, weight_decay=1e-4),
           clip_grad=dict(max_norm=0.1, norm_type=2),
           paramwise_cfg=dict(custom_keys={"backbone": dict(lr_mult=0.1)}, norm_decay_mult=0.0,
                              bias_decay_mult=0.5))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1))
        self.neck = nn.Conv2d(4, 4, 1)
        self.head = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))

    def forward(self, x):
        x = self.neck(self.backbone(x)).mean((2, 3))
        return self.head(x)


def _build(model, constructor=None):
    cfg = copy.deepcopy(CFG)
    if constructor:
        cfg["constructor"] = constructor
    with DefaultScope.overwrite_default_scope("mmdet"):
        return build_optim_wrapper(model, cfg)


def _options(optimizer):
    """{parameter: its group's options}."""
    return {p: tuple(sorted((k, v) for k, v in g.items() if k != "params"))
            for g in optimizer.param_groups for p in g["params"]}


def test_registered_in_mmdet_and_found_from_a_config_name():
    assert OPTIM_WRAPPER_CONSTRUCTORS.get("MergedGroupsOptimWrapperConstructor") \
        is MergedGroupsOptimWrapperConstructor
    model = Net()
    assert len(_build(model).optimizer.param_groups) == len(list(model.parameters()))
    merged = _build(model, "MergedGroupsOptimWrapperConstructor").optimizer
    # The backbone (its custom key sets its options, norms and biases
    # included), then the other weights, biases (decay x 0.5) and norms
    # (decay 0).
    assert [(g["lr"], g["weight_decay"], len(g["params"])) for g in merged.param_groups] == [
        (1e-5, 1e-4, 6), (1e-4, 1e-4, 3), (1e-4, 5e-5, 3), (1e-4, 0.0, 2)]


# Bit for bit without clipping.  With it, the grad norm sums the parameters
# in the merged groups' order, another float order: last-bit differences.
@pytest.mark.parametrize("clip, rtol", [(False, 0.0), (True, 1e-6)], ids=["no_clip", "clip"])
def test_every_parameter_keeps_its_options_and_the_steps_agree(clip, rtol, monkeypatch):
    if not clip:
        monkeypatch.delitem(CFG, "clip_grad")
    torch.manual_seed(0)
    model = Net()
    twin = copy.deepcopy(model)
    default, merged = _build(model), _build(twin, "MergedGroupsOptimWrapperConstructor")
    by_name = dict(twin.named_parameters())
    default_opts, merged_opts = _options(default.optimizer), _options(merged.optimizer)
    for name, p in model.named_parameters():
        assert merged_opts[by_name[name]] == default_opts[p], name
    x = torch.randn(2, 3, 8, 8)
    for _ in range(3):
        # The same gradients for both (CPU backward threads need not sum in
        # one order, and Adam magnifies a last-bit difference of a ~0 grad).
        model(x).square().sum().backward()
        for name, p in model.named_parameters():
            by_name[name].grad = p.grad.clone()
        for wrapper in (default, merged):  # clip_grad, then AdamW
            wrapper.step()
            wrapper.zero_grad()
    for name, p in model.named_parameters():
        torch.testing.assert_close(by_name[name], p, rtol=rtol, atol=0)


def test_merge_keeps_first_appearance_order():
    a, b, c, d = (torch.zeros(1) for _ in range(4))
    groups = [dict(params=[a], lr=1.0), dict(params=[b], lr=0.1), dict(params=[c], lr=1.0),
              dict(params=[d], lr=0.1, weight_decay=0.0)]
    merged = merge_param_groups(groups)
    assert [[id(p) for p in g["params"]] for g in merged] == [[id(a), id(c)], [id(b)], [id(d)]]
    assert [g.get("weight_decay") for g in merged] == [None, None, 0.0]


def test_list_options_merge_and_shared_parameters_are_refused():
    a, b, c = (torch.zeros(1) for _ in range(3))
    merged = merge_param_groups([dict(params=[a], betas=[0.9, 0.99]), dict(params=[b], lr=1.0),
                                 dict(params=[c], betas=[0.9, 0.99])])
    assert [len(g["params"]) for g in merged] == [2, 1] and merged[0]["betas"] == [0.9, 0.99]
    with pytest.raises(ValueError, match="more than one parameter group"):
        merge_param_groups([dict(params=[a], lr=1.0), dict(params=[a], lr=1.0)])
    # Through the constructor: a weight tied between two modules, as the
    # default constructor (and PyTorch) refuses it too.
    net = Net()
    net.head[2].weight = net.head[0].weight
    cfg = copy.deepcopy(CFG)
    cfg["constructor"] = "MergedGroupsOptimWrapperConstructor"
    with DefaultScope.overwrite_default_scope("mmdet"), \
            pytest.raises(ValueError, match="more than one parameter group"):
        build_optim_wrapper(net, cfg)


# Without paramwise options mmengine builds one group and never merges:
# the constructor must leave that path alone.
@pytest.mark.parametrize("paramwise_cfg", [None, {}])
def test_without_paramwise_options_there_is_one_group(paramwise_cfg):
    cfg = copy.deepcopy(CFG)
    cfg["constructor"] = "MergedGroupsOptimWrapperConstructor"
    cfg.pop("paramwise_cfg")
    if paramwise_cfg is not None:
        cfg["paramwise_cfg"] = paramwise_cfg
    with DefaultScope.overwrite_default_scope("mmdet"):
        assert len(build_optim_wrapper(Net(), cfg).optimizer.param_groups) == 1
