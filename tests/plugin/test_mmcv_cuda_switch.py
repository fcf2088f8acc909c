"""The switch that puts mmcv's own CUDA kernels under mmcv's
MultiScaleDeformableAttnFunction on mmcv-lite, on CPU with a fake kernels
module (mmcv's Function runs on CPU tensors as on CUDA ones): what the
Function hands the kernels, that it routes whatever module it is given,
and that every way in and out leaves mmcv as it found it."""
import importlib
import sys
import types

import pytest
import torch
from mmcv_fakes import fake_build, pretend_gpu

import msda_mm
from msda_mm.compat import MMCV_LITE, ext_stub, mmcv_cuda_build, mmcv_cuda_switch

# isort: split
from mmcv.ops import multi_scale_deform_attn

pytestmark = pytest.mark.skipif(not MMCV_LITE, reason="compiled mmcv runs its own kernels")

FUNCTION = multi_scale_deform_attn.MultiScaleDeformableAttnFunction


@pytest.fixture
def kernels(tmp_path):
    """A fake build's kernels module; mmcv-lite's default route afterwards."""
    module = mmcv_cuda_build.load_extension(fake_build(tmp_path / "build"))
    module.CALLS.clear()
    yield module
    mmcv_cuda_switch.use_triton_msda()


def _assert_default_route():
    assert multi_scale_deform_attn.ext_module is sys.modules[ext_stub.EXT_NAME]
    assert FUNCTION.apply is msda_mm.multi_scale_deformable_attention
    assert mmcv_cuda_switch.active() is None


def _inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    shapes = torch.tensor([[3, 4], [2, 2]])
    value = torch.randn(2, 16, 2, 4, generator=g, dtype=dtype)
    loc = torch.rand(2, 5, 2, 2, 3, 2, generator=g)
    attn = torch.rand(2, 5, 2, 2, 3, generator=g)
    return value, shapes, torch.tensor([0, 12]), loc, attn


def test_mmcv_function_runs_the_kernels_it_is_given(kernels):
    assert mmcv_cuda_switch.use_mmcv_cuda_msda(kernels) is kernels
    assert multi_scale_deform_attn.ext_module is kernels and "apply" not in vars(FUNCTION)
    assert mmcv_cuda_switch.active() is kernels
    value, shapes, starts, loc, attn = _inputs()
    leaves = [t.requires_grad_() for t in (value, loc, attn)]
    out = FUNCTION.apply(value, shapes, starts, loc, attn, 64)
    grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
    # mmcv casts locations and weights to value's dtype and passes im2col_step by name.
    assert kernels.CALLS == [
        dict(op="forward", dtypes=(torch.float64,) * 3, im2col_step=64),
        dict(op="backward", im2col_step=64)]
    truth_leaves = [t.detach().double().requires_grad_() for t in (value, loc, attn)]
    truth = msda_mm.msda_reference(truth_leaves[0], shapes, *truth_leaves[1:])
    truth_grads = torch.autograd.grad(truth, truth_leaves, torch.ones_like(truth))
    torch.testing.assert_close(out, truth, rtol=0, atol=0)
    for grad, want, leaf in zip(grads, truth_grads, leaves):
        assert grad.dtype == leaf.dtype
        torch.testing.assert_close(grad.double(), want, rtol=1e-6, atol=1e-6)
    mmcv_cuda_switch.use_triton_msda()
    _assert_default_route()


def test_the_block_forms_restore_the_route_even_on_error(kernels):
    with pytest.raises(KeyError):
        with mmcv_cuda_switch.mmcv_cuda_msda(kernels) as module:
            assert module is kernels and mmcv_cuda_switch.active() is kernels
            raise KeyError("inside")
    _assert_default_route()

    def sampler(*args):
        return args

    with mmcv_cuda_switch.mmcv_cuda_msda(kernels):
        with mmcv_cuda_switch.function_routed_to(sampler):
            assert FUNCTION.apply is sampler and mmcv_cuda_switch.active() is None
        assert mmcv_cuda_switch.active() is kernels
    _assert_default_route()


def test_bad_kernels_are_refused():
    with pytest.raises(TypeError, match="kernels module half lacks ms_deform_attn_backward"):
        mmcv_cuda_switch.use_mmcv_cuda_msda(_half_module())
    with pytest.raises(TypeError, match="must be a module, a build folder or None, got int"):
        mmcv_cuda_switch.use_mmcv_cuda_msda(3)
    _assert_default_route()


def _half_module():
    module = types.ModuleType("half")
    module.ms_deform_attn_forward = lambda *args, **kwargs: None
    return module


def test_compiled_mmcv_is_left_alone(monkeypatch, kernels):
    monkeypatch.setattr(ext_stub, "is_stubbed", lambda: False)
    with pytest.raises(RuntimeError, match="mmcv is compiled"):
        mmcv_cuda_switch.use_mmcv_cuda_msda(kernels)
    assert mmcv_cuda_switch.switch_on_request("1") is None
    monkeypatch.undo()
    _assert_default_route()


@pytest.fixture
def on_gpu(monkeypatch, tmp_path):
    """A pretended GPU whose default build is a fake one (its folder)."""
    yield fake_build(pretend_gpu(monkeypatch, tmp_path / "cache"))
    mmcv_cuda_switch.use_triton_msda()


@pytest.mark.parametrize("request_, switched", [(None, False), ("", False), ("0", False),
                                                ("1", True), ("folder", True)])
def test_the_environment_variable(on_gpu, request_, switched):
    env = {} if request_ is None else {mmcv_cuda_switch.ENV: str(on_gpu) if request_ == "folder"
                                       else request_}
    module = mmcv_cuda_switch.apply_env(env)
    assert (module is not None) == switched
    assert mmcv_cuda_switch.active() is module
    if switched:
        assert module is mmcv_cuda_build.load_extension(on_gpu)


def test_without_a_gpu_there_is_nothing_to_switch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert mmcv_cuda_switch.apply_env({mmcv_cuda_switch.ENV: "1"}) is None
    _assert_default_route()


@pytest.mark.parametrize("env", [None, "0"])
def test_the_config_module_switches_on_import(on_gpu, monkeypatch, env):
    if env is None:
        monkeypatch.delenv(mmcv_cuda_switch.ENV, raising=False)
    else:
        monkeypatch.setenv(mmcv_cuda_switch.ENV, env)
    monkeypatch.delitem(sys.modules, "msda_mm.compat.with_mmcv_cuda", raising=False)
    module = importlib.import_module("msda_mm.compat.with_mmcv_cuda")
    if env == "0":
        assert module.KERNELS is None
        _assert_default_route()
    else:
        assert module.KERNELS is mmcv_cuda_build.load_extension(on_gpu)
        assert mmcv_cuda_switch.active() is module.KERNELS


def test_a_missing_build_says_how_to_make_one(on_gpu, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty"))
    with pytest.raises(mmcv_cuda_build.BuildError, match="tools/build_mmcv_msda.py"):
        mmcv_cuda_switch.apply_env({mmcv_cuda_switch.ENV: "1"})
    _assert_default_route()
