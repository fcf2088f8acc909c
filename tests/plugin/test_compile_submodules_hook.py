"""CompileSubmodulesHook: the chosen submodules of a model compiled in place
before training, the same results and state_dict; bad paths named.  The
tests compile with Dynamo's ``eager`` backend (graph capture without code
generation: no C++ compiler, seconds not minutes)."""
import types

import pytest
import torch
from mmdet.registry import HOOKS
from mmdet.testing import demo_mm_inputs
from torch import nn

from msda_mm.engine import CompileSubmodulesHook, compile_submodules

from .detr_configs import build_detector
from .test_dino_train_step import small_dino_cfg


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.GELU()) for _ in range(2))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _compiled(module):
    return getattr(module, "_compiled_call_impl", None) is not None


def test_built_from_a_config_and_compiles_each_member_of_a_module_list():
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(3, 4)
    want, keys = net(x), list(net.state_dict())
    hook = HOOKS.build(dict(type="CompileSubmodulesHook", modules=["layers"], backend="eager"))
    assert isinstance(hook, CompileSubmodulesHook)
    hook.before_train(types.SimpleNamespace(model=net))
    assert all(_compiled(layer) for layer in net.layers) and not _compiled(net.head)
    torch.testing.assert_close(net(x), want, rtol=0, atol=0)
    assert list(net.state_dict()) == keys


def test_a_wrapped_model_is_compiled_underneath():
    net = Net()
    hook = CompileSubmodulesHook(modules=["head"], backend="eager")
    hook.before_train(types.SimpleNamespace(model=nn.DataParallel(net)))
    assert _compiled(net.head)


def test_bad_paths_are_refused_before_anything_compiles():
    net = Net()
    with pytest.raises(ValueError, match=r"no submodule 'encoder' \(its children: \['head', "
                                         r"'layers'\]\)"):
        compile_submodules(net, ["layers", "encoder"], backend="eager")
    assert not any(_compiled(layer) for layer in net.layers)
    with pytest.raises(TypeError, match="the string 'layers'"):
        compile_submodules(net, "layers")
    for bad in ("layers", []):
        with pytest.raises(ValueError, match="non-empty list of submodule paths"):
            CompileSubmodulesHook(modules=bad)


def test_dino_transformer_layers_compile_to_the_same_losses(reference_backend, quiet_mmengine):
    # What configs/dino_bf16_fast_host_compiled.py asks for, on a small DINO.
    torch.manual_seed(0)
    model = build_detector(small_dino_cfg())
    model.init_weights()
    model.train()
    batch = demo_mm_inputs(batch_size=2, image_shapes=[(3, 64, 64), (3, 64, 48)],
                           num_items=[3, 1], num_classes=80)
    data = model.data_preprocessor(batch, True)

    def losses():
        torch.manual_seed(1)  # the denoising queries' noise
        return model(**data, mode="loss")

    want = losses()
    compile_submodules(model, ["encoder.layers", "decoder.layers"], backend="eager")
    assert all(_compiled(layer) for layer in [*model.encoder.layers, *model.decoder.layers])
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    got = losses()
    assert counters["stats"]["unique_graphs"] >= 2, dict(counters["stats"])  # captured, not skipped
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=1e-6, msg=name)
