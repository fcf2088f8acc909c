"""SelectiveAmpOptimWrapper: mmengine's AmpOptimWrapper with chosen submodules
of the model in fp32, through a real DINO training step (CPU autocast here,
CUDA in the GPU test)."""
import pytest
import torch
from mmdet.registry import OPTIM_WRAPPERS
from mmdet.testing import demo_mm_inputs
from mmengine.model import BaseModel
from mmengine.optim.optimizer import amp_optimizer_wrapper
from mmengine.runner import Runner
from torch.utils.data import Dataset

from msda_mm.engine import SelectiveAmpOptimWrapper, selective_amp_optim_wrapper

from .detr_configs import build_detector
from .test_dino_train_step import small_dino_cfg


@pytest.fixture
def cuda_check_passes(monkeypatch):
    """AmpOptimWrapper refuses to be built without a GPU; mmengine's autocast
    turns CPU autocast on where there is none, which these tests use."""
    monkeypatch.setattr(amp_optimizer_wrapper, "is_cuda_available", lambda: True)


def _wrapper(model, **kwargs):
    return OPTIM_WRAPPERS.build(dict(type="SelectiveAmpOptimWrapper", dtype="bfloat16",
                                     optimizer=torch.optim.SGD(model.parameters(), lr=1e-3),
                                     **kwargs))


def _output_dtypes(model):
    """Records the output dtype of the head's branches and of every encoder
    value projection, by kind, as the step runs."""
    seen = {"head": set(), "encoder": set()}

    def recorder(kind):
        return lambda module, args, output: seen[kind].add(output.dtype)

    for branch in [*model.bbox_head.cls_branches, *model.bbox_head.reg_branches]:
        branch.register_forward_hook(recorder("head"))
    for layer in model.encoder.layers:
        layer.self_attn.value_proj.register_forward_hook(recorder("encoder"))
    return seen


def _step(model, optim_wrapper, device="cpu"):
    batch = demo_mm_inputs(batch_size=2, image_shapes=[(3, 64, 64), (3, 64, 48)],
                           num_items=[3, 1], num_classes=80)
    if device != "cpu":
        batch["inputs"] = [img.to(device) for img in batch["inputs"]]
    return model.train_step(batch, optim_wrapper)


def test_dino_step_keeps_the_head_in_fp32_and_the_rest_in_bf16(reference_backend, quiet_mmengine,
                                                               cuda_check_passes):
    torch.manual_seed(0)
    model = build_detector(small_dino_cfg())
    model.init_weights()
    model.train()
    seen = _output_dtypes(model)
    wrapper = _wrapper(model, fp32_modules=["bbox_head"])
    log_vars = _step(model, wrapper)
    assert seen == {"head": {torch.float32}, "encoder": {torch.bfloat16}}
    assert all(torch.isfinite(torch.as_tensor(v)) for v in log_vars.values())
    # Evaluation runs without autocast: the hooks leave it alone.
    model.eval()
    seen["head"].clear()
    with torch.no_grad():
        model.test_step(demo_mm_inputs(batch_size=1, image_shapes=[(3, 64, 64)],
                                       num_classes=80))
    assert seen["head"] == {torch.float32}


def test_without_fp32_modules_it_is_amp_optim_wrapper(reference_backend, quiet_mmengine,
                                                      cuda_check_passes):
    torch.manual_seed(0)
    model = build_detector(small_dino_cfg())
    model.init_weights()  # DINO's level_embed is uninitialised memory until then
    model.train()
    seen = _output_dtypes(model)
    _step(model, _wrapper(model))
    assert seen == {"head": {torch.bfloat16}, "encoder": {torch.bfloat16}}


def test_one_wrapper_serves_one_model(cuda_check_passes):
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    wrapper = _wrapper(first, fp32_modules=[""])  # "": the whole model
    with wrapper.optim_context(first):
        assert first(torch.randn(1, 2)).dtype == torch.float32
    with wrapper.optim_context(first):  # again: hooked once
        pass
    assert len(first._forward_pre_hooks) == 1
    with pytest.raises(RuntimeError, match="serves one model"):
        with wrapper.optim_context(second):
            pass


def test_a_wrapped_model_is_hooked_underneath(cuda_check_passes):
    # mmengine's model wrappers (DDP; DataParallel here, on the CPU a plain
    # container) hand optim_context themselves: the paths are the model's.
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    wrapper = _wrapper(model, fp32_modules=["1"])
    with wrapper.optim_context(torch.nn.DataParallel(model)):
        assert model[0](torch.randn(1, 2)).dtype == torch.bfloat16
        assert model[1](torch.randn(1, 2)).dtype == torch.float32


def test_other_autocast_devices_are_refused(cuda_check_passes, monkeypatch):
    monkeypatch.setattr(selective_amp_optim_wrapper, "get_device", lambda: "npu")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(NotImplementedError, match="CUDA and CPU autocast; this runs on npu"):
        with _wrapper(model, fp32_modules=[""]).optim_context(model):
            pass


@pytest.mark.parametrize("bad", ["bbox_head", ["bbox_head", 3]])
def test_fp32_modules_must_be_a_list_of_paths(bad, cuda_check_passes):
    with pytest.raises(TypeError, match="fp32_modules must be a list of submodule paths"):
        _wrapper(torch.nn.Linear(2, 2), fp32_modules=bad)


def test_an_unknown_path_names_the_models_children(cuda_check_passes):
    model = build_detector(small_dino_cfg())
    wrapper = _wrapper(model, fp32_modules=["bbox_heads"])
    with pytest.raises(ValueError, match="DINO has no submodule 'bbox_heads'.*'bbox_head'"):
        with wrapper.optim_context(model):
            pass


def test_registered_for_mmdet_configs():
    assert OPTIM_WRAPPERS.get("SelectiveAmpOptimWrapper") is SelectiveAmpOptimWrapper


@pytest.mark.gpu
def test_dino_bf16_step_on_cuda_keeps_the_head_in_fp32(quiet_mmengine):
    torch.manual_seed(0)
    model = build_detector(small_dino_cfg()).cuda()
    model.init_weights()
    model.train()
    seen = _output_dtypes(model)
    log_vars = _step(model, _wrapper(model, fp32_modules=["bbox_head"]), device="cuda")
    assert seen == {"head": {torch.float32}, "encoder": {torch.bfloat16}}
    assert all(torch.isfinite(torch.as_tensor(v)) for v in log_vars.values())


class _Net(BaseModel):
    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(2, 2)
        self.head = torch.nn.Sequential(torch.nn.Linear(2, 2))

    def forward(self, inputs, data_samples=None, mode="tensor"):
        out = self.head(self.trunk(torch.stack(inputs)))
        return {"loss": out.float().pow(2).mean()} if mode == "loss" else out


class _Samples(Dataset):
    """Two samples; ``loadable=False`` raises on any load, so that a Runner
    that gets as far as the first batch fails with this, not ValueError."""

    def __init__(self, loadable):
        self.loadable = loadable

    def __len__(self):
        return 2

    def __getitem__(self, index):
        if not self.loadable:
            raise LookupError("a training batch was loaded")
        return dict(inputs=torch.full((2,), float(index)))


def _runner(tmp_path, model, dataset, constructor, fp32_modules):
    return Runner(model=model, work_dir=str(tmp_path), experiment_name=tmp_path.name,
                  default_scope="mmdet", default_hooks=dict(checkpoint=None),
                  train_dataloader=dict(dataset=dataset, batch_size=2, num_workers=0,
                                        sampler=dict(type="DefaultSampler", shuffle=False)),
                  train_cfg=dict(by_epoch=False, max_iters=1),
                  optim_wrapper=dict(type="SelectiveAmpOptimWrapper", dtype="bfloat16",
                                     constructor=constructor, fp32_modules=fp32_modules,
                                     optimizer=dict(type="SGD", lr=1e-3)))


CONSTRUCTORS = ["DefaultOptimWrapperConstructor", "MergedGroupsOptimWrapperConstructor"]


@pytest.mark.parametrize("constructor", CONSTRUCTORS)
@pytest.mark.parametrize("path, close", [("heads", "'head'"), ("head.0.weight", "'head.0'")])
def test_a_runner_refuses_a_bad_path_before_loading_data(path, close, constructor, tmp_path,
                                                         quiet_mmengine, cuda_check_passes):
    runner = _runner(tmp_path, _Net(), _Samples(loadable=False), constructor, ["trunk", path])
    with pytest.raises(ValueError, match=rf"SelectiveAmpOptimWrapper: fp32_modules: _Net has no "
                                         rf"submodule '{path}' .*close matches: \[{close}"):
        runner.train()


@pytest.mark.parametrize("constructor", CONSTRUCTORS)
def test_a_runner_trains_with_good_paths(constructor, tmp_path, quiet_mmengine,
                                         cuda_check_passes):
    model = _Net()
    seen = {"trunk": set(), "head": set()}
    for name in seen:
        getattr(model, name).register_forward_hook(
            lambda module, args, output, name=name: seen[name].add(output.dtype))
    _runner(tmp_path, model, _Samples(loadable=True), constructor, ["head"]).train()
    assert seen == {"trunk": {torch.bfloat16}, "head": {torch.float32}}
