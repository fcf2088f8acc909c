"""tools/parity.py on CPU: the same checkpoint evaluated with msda_mm's and
mmcv's MSDA passes with near-identical layer outputs; a perturbed mmcv side
fails; a short training run writes both loss curves; grads and kernels run
on one batch; the op switch swaps exactly what it says (on mmcv-lite also
mmcv's CUDA entry point); and the mmcv side runs what it is chosen to run
(a fake build stands in for mmcv's CUDA kernels)."""
import json
import runpy
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

import msda_mm
from msda_mm.compat import MMCV_LITE, mmcv_cuda_switch
from msda_mm.compat.mmcv_cuda_build import BuildError, load_extension
from msda_mm.datasets.synthetic import ann_file
from msda_mm.models import TritonMSDeformAttn
from msda_mm.parity import attention

# isort: split
# After msda_mm, whose mmcv-lite shims make these importable.
from mmcv.ops import MultiScaleDeformableAttention, multi_scale_deform_attn
from mmcv_fakes import fake_build, pretend_gpu
from mmdet.registry import MODELS

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"

CONFIG = str(ROOT / "configs/synthetic/dino_tiny_cpu.py")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """--cfg-options that cut the CPU demo to 8 training images (two batches
    of 4) and 2 test images, and a checkpoint of its random initialisation."""
    folder = tmp_path_factory.mktemp("parity")
    root = f"{folder}/data/"
    dataset = {"data_root": root, "synthetic_cfg.num_train": 8, "synthetic_cfg.num_val": 2}
    options = ["--cfg-options", f"test_evaluator.ann_file={root}{ann_file('val')}"]
    options += [f"{loader}.dataset.{key}={value}"
                for loader in ("train_dataloader", "test_dataloader")
                for key, value in dataset.items()]
    init_default_scope("mmdet")
    model = MODELS.build(Config.fromfile(CONFIG).model)
    model.init_weights()
    checkpoint = folder / "random.pth"
    torch.save(dict(state_dict=model.state_dict()), checkpoint)
    return options, str(checkpoint)


@pytest.fixture
def parity_tool(monkeypatch):
    """tools/parity.py's globals (its siblings common.py, train.py importable)."""
    monkeypatch.syspath_prepend(str(TOOLS))
    return runpy.run_path(str(TOOLS / "parity.py"))


@pytest.fixture
def parity(parity_tool, reference_backend, one_intra_op_thread, capsys):
    """tools/parity.py ARGS in this process, as on a CPU without the
    interpreter (the PyTorch reference; one intra-op thread, as the model's
    ops are small): its exit code and output.  tools/run_e2e.py's smoke test
    runs eval, grads and kernels as commands."""
    def run(*args: str) -> tuple[int, str]:
        status = parity_tool["main"](list(args))
        return status, capsys.readouterr().out

    return run


@pytest.mark.slow
def test_eval_of_one_checkpoint_passes(tiny, tmp_path, parity):
    options, checkpoint = tiny
    status, log = parity("eval", CONFIG, checkpoint, "--out", str(tmp_path),
                         "--tolerance-layer", "1e-4", *options)
    assert status == 0, log[-4000:]
    # Both COCO AP tables, the comparison and the verdict.
    assert log.count("Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all") == 2
    assert "PASS: AP tolerance 0.1 AP points: all 6 metrics within" in log
    report = json.loads((tmp_path / "parity_eval.json").read_text())
    assert report["passed"] and report["tolerance_ap"] == 0.1
    assert all(m["delta_ap"] == 0 for m in report["metrics"])
    # 3 encoder and 3 decoder layers; the implementations differ only in
    # float rounding.
    assert len(report["layers"]) == 6
    assert all(r["max_abs_diff"] < 1e-4 * max(1.0, r["max_abs_mmcv"]) for r in report["layers"])


@pytest.mark.slow
def test_grads_compares_three_backward_passes_of_one_batch(tiny, tmp_path, parity):
    options, checkpoint = tiny
    # An fp32 config on the CPU: fp32_compute changes nothing and the
    # reference is deterministic, so every difference is exactly zero.
    status, out = parity("grads", CONFIG, "--checkpoint", checkpoint, "--out", str(tmp_path),
                         *options)
    assert status == 0, out[-4000:]
    report = json.loads((tmp_path / "parity_grads.json").read_text())
    assert set(report["losses"]) == {"configured", "configured_again", "fp32_grad_accum",
                                     "fp32_compute"}
    assert len(set(report["losses"].values())) == 1
    names = {r["parameter"] for r in report["parameters"]}
    assert "encoder.layers.0.self_attn.value_proj.weight" in names and len(names) > 100
    assert all(row["max"] == 0 for row in report["summary"].values())
    assert set(report["summary"]) == {"floor", "fp32_compute", "bf16_value"}
    assert report["checkpoint"] == checkpoint
    assert "most moved by fp32_compute" in out


@pytest.mark.slow
def test_kernels_says_when_no_call_is_bf16(tiny, tmp_path, parity):
    # The CPU demo is fp32: no op call to check, which is exit code 4, not a pass.
    options, checkpoint = tiny
    status, out = parity("kernels", CONFIG, "--checkpoint", checkpoint, "--out", str(tmp_path),
                         *options)
    assert status == 4, out[-4000:]
    assert "had a bf16 value: nothing to check" in out
    report = json.loads((tmp_path / "parity_kernels.json").read_text())
    assert report["calls"] == [] and report["checkpoint"] == checkpoint


@pytest.mark.slow
def test_eval_fails_when_the_mmcv_side_differs(tiny, tmp_path, parity, monkeypatch):
    options, checkpoint = tiny
    exact = multi_scale_deform_attn.multi_scale_deformable_attn_pytorch
    # mmcv's forward calls this for CPU tensors: only the mmcv side changes.
    monkeypatch.setattr(multi_scale_deform_attn, "multi_scale_deformable_attn_pytorch",
                        lambda *args: exact(*args) + 0.01)
    status, _ = parity("eval", CONFIG, checkpoint, "--out", str(tmp_path), "--max-batches", "1",
                       "--tolerance-layer", "1e-3", *options)
    assert status == 1
    report = json.loads((tmp_path / "parity_eval.json").read_text())
    assert not report["passed"] and "layer tolerance 0.001: exceeded by" in report["verdict"]
    assert all(r["max_abs_diff"] > 1e-3 for r in report["layers"])


@pytest.mark.slow
def test_train_writes_both_loss_curves(tiny, tmp_path, parity):
    options, _ = tiny
    # Three steps of batch 4 over 8 images: the third starts a second epoch.
    status, out = parity("train", CONFIG, "--iters", "3", "--seed", "1", "--out", str(tmp_path),
                         *options)
    assert status == 0, out[-4000:]
    report = json.loads((tmp_path / "parity_train.json").read_text())
    assert len(report["loss"]["triton"]) == len(report["loss"]["mmcv"]) == 3
    assert len(report["rel_diff"]) == 3 and report["max_rel_diff"] < 1e-4
    assert report["log_vars"]["mmcv"]["loss"] == report["loss"]["mmcv"]
    assert (tmp_path / "parity_train.png").read_bytes().startswith(b"\x89PNG")
    assert "max relative difference of the total loss" in out


def test_bad_command_lines_say_what_is_wrong(parity_tool, capsys):
    with pytest.raises(SystemExit):
        parity_tool["parse_args"](["eval", CONFIG, "model.pth", "--tolerance-ap", "-1"])
    assert "'-1' is not a finite number >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parity_tool["parse_args"](["train", CONFIG, "--iters", "0"])
    assert "'0' is not an integer >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="checkpoint not found: missing.pth"):
        parity_tool["main"](["eval", CONFIG, "missing.pth"])
    with pytest.raises(SystemExit, match="config file not found: missing.py"):
        parity_tool["main"](["train", "missing.py"])


@pytest.fixture
def parity_commands(monkeypatch):
    """tools/parity_commands.py's globals (what tools/parity.py runs after its command line)."""
    monkeypatch.syspath_prepend(str(TOOLS))
    return runpy.run_path(str(TOOLS / "parity_commands.py"))


def test_kernels_report_passes_only_if_every_call_does(parity_commands, capsys):
    call = dict(call=0, value=[2, 30, 8, 32], locations=[2, 7, 8, 4, 4, 2],
                fp32_grad_accum=True, output=-0.4, grad_value=-0.2, grad_loc=3e-7,
                grad_attn=2e-7, passed=True, mmcv_fp32=None)
    native = dict(call, fp32_grad_accum=False, grad_value=None)
    ops = dict(triton="msda_mm Triton kernels", mmcv="mmcv multi_scale_deformable_attn_pytorch")
    assert parity_commands["_print_kernels"]("cfg.py", [call, native], "out.json", ops) == 0
    out = capsys.readouterr().out
    assert "PASS: 2 of 2 checks within" in out
    assert "  mmcv: mmcv multi_scale_deformable_attn_pytorch" in out
    # The difference from mmcv's kernels is shown, not judged.
    far = dict(call, call=1, mmcv_fp32=dict(output=1e-7, grad_value=2e-7, grad_loc=0.5,
                                            grad_attn=1e-7))
    bad = dict(call, call=2, output=1.5, passed=False)
    assert parity_commands["_print_kernels"]("cfg.py", [call, native, far, bad], "out.json",
                                             ops) == 3
    out = capsys.readouterr().out
    assert "FAIL: 3 of 4 checks within" in out and out.count("FAIL") == 2
    assert "  5.0e-01  ok" in out


def test_mmcv_choices_are_the_librarys(parity_tool, capsys):
    # Spelled in the tool so that --help answers before torch loads.
    assert parity_tool["MMCV_KERNELS"] == attention.MMCV_KERNELS
    with pytest.raises(SystemExit):
        parity_tool["parse_args"](["kernels", CONFIG, "--mmcv", "triton"])
    assert "invalid choice: 'triton'" in capsys.readouterr().err


def test_mmcv_cuda_that_cannot_run_stops_the_tool(parity_commands):
    args = parity_commands["argparse"].Namespace(mmcv="cuda")
    with pytest.raises(SystemExit, match="--mmcv cuda: mmcv's CUDA kernels need a model on a "
                                         "CUDA device, not cpu"):
        parity_commands["_mmcv_side"](args, torch.device("cpu"))


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.triton = TritonMSDeformAttn(embed_dims=8, num_heads=2, num_levels=1, num_points=2)
        self.mmcv = MultiScaleDeformableAttention(embed_dims=8, num_heads=2, num_levels=1,
                                                  num_points=2)


@pytest.mark.parametrize("op, cls", [("triton", TritonMSDeformAttn),
                                     ("mmcv", MultiScaleDeformableAttention)])
def test_use_op_switches_every_attention_and_restores(op, cls):
    model = TwoLayers()
    with attention.use_op(model, op):
        assert type(model.triton) is type(model.mmcv) is cls
    assert type(model.triton) is TritonMSDeformAttn
    assert type(model.mmcv) is MultiScaleDeformableAttention


def test_use_op_gives_an_mmcv_module_the_triton_settings_inside_only():
    model = TwoLayers()
    model.triton.deterministic = True
    mmcv_attributes = dict(vars(model.mmcv))
    fresh = TritonMSDeformAttn(embed_dims=8, num_heads=2, num_levels=1, num_points=2)
    assert {name: getattr(fresh, name) for name in attention.TRITON_SETTINGS} == \
        attention.TRITON_SETTINGS
    with attention.use_op(model, "triton"):
        assert {name: getattr(model.mmcv, name) for name in attention.TRITON_SETTINGS} == \
            attention.TRITON_SETTINGS
        assert model.triton.deterministic is True  # a TritonMSDeformAttn keeps its own
        # batch_first=False: query (Q, B, C), value (S, B, C).
        out = model.mmcv(torch.randn(3, 1, 8), value=torch.randn(4, 1, 8),
                         reference_points=torch.rand(1, 3, 1, 2),
                         spatial_shapes=torch.tensor([[2, 2]]),
                         level_start_index=torch.tensor([0]))
        assert out.shape == (3, 1, 8)
    assert vars(model.mmcv) == mmcv_attributes
    assert model.triton.deterministic is True


@pytest.fixture
def fake_mmcv_kernels(monkeypatch, tmp_path):
    """A pretended GPU whose default build is a fake one (its folder);
    mmcv-lite's default route afterwards."""
    yield fake_build(pretend_gpu(monkeypatch, tmp_path / "cache"))
    mmcv_cuda_switch.use_triton_msda()


@pytest.mark.skipif(not MMCV_LITE, reason="msda_mm builds mmcv's kernels for mmcv-lite")
def test_the_mmcv_side_is_chosen_as_asked(monkeypatch, tmp_path):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert attention.mmcv_side(None, cpu) is attention.MMCV_PYTORCH
    assert attention.mmcv_side("pytorch", cuda) is attention.MMCV_PYTORCH
    with pytest.raises(ValueError, match="need a model on a CUDA device, not cpu"):
        attention.mmcv_side("cuda", cpu)
    with pytest.raises(ValueError, match="must be one of"):
        attention.mmcv_side("triton", cuda)
    folder = pretend_gpu(monkeypatch, tmp_path)
    # Nothing built: the default falls back, 'cuda' says how to build.
    assert attention.mmcv_side(None, cuda) is attention.MMCV_PYTORCH
    with pytest.raises(BuildError, match="tools/build_mmcv_msda.py"):
        attention.mmcv_side("cuda", cuda)
    fake_build(folder)
    side = attention.mmcv_side(None, cuda)
    assert side == attention.MmcvSide("cuda", load_extension(folder))
    assert attention.describe("mmcv", cuda, side) == \
        "mmcv 2.1.0 CUDA kernels (msda_mm build, sm 9.0)"
    assert attention.describe("mmcv", cpu, side) == "mmcv multi_scale_deformable_attn_pytorch"


@pytest.mark.skipif(not MMCV_LITE, reason="msda_mm builds mmcv's kernels for mmcv-lite")
def test_the_mmcv_side_runs_its_kernels_inside_use_op_only(fake_mmcv_kernels):
    function = multi_scale_deform_attn.MultiScaleDeformableAttnFunction
    kernels = load_extension(fake_mmcv_kernels)
    with attention.use_op(TwoLayers(), "mmcv", attention.MmcvSide("cuda", kernels)):
        assert multi_scale_deform_attn.ext_module is kernels and "apply" not in vars(function)
    assert function.apply is msda_mm.multi_scale_deformable_attention
    assert mmcv_cuda_switch.active() is None


@pytest.mark.skipif(not MMCV_LITE, reason="msda_mm builds mmcv's kernels for mmcv-lite")
def test_reports_say_what_each_class_runs_as_configured(fake_mmcv_kernels):
    model, cuda = TwoLayers(), torch.device("cuda")
    assert attention.as_configured(model, torch.device("cpu")) == dict(
        TritonMSDeformAttn=attention.describe("triton", torch.device("cpu")),
        MultiScaleDeformableAttention="mmcv multi_scale_deformable_attn_pytorch")
    assert attention.as_configured(model, cuda) == dict(
        TritonMSDeformAttn="msda_mm Triton kernels",
        MultiScaleDeformableAttention="msda_mm Triton kernels (mmcv-lite's route of mmcv's "
                                      "Function)")
    with mmcv_cuda_switch.mmcv_cuda_msda(load_extension(fake_mmcv_kernels)):
        assert attention.as_configured(model, cuda)["MultiScaleDeformableAttention"] == \
            "mmcv 2.1.0 CUDA kernels (msda_mm build, sm 9.0)"


@pytest.mark.skipif(not MMCV_LITE, reason="msda_mm builds mmcv's kernels for mmcv-lite")
def test_fp32_kernels_are_compared_with_mmcvs(fake_mmcv_kernels):
    # The fake build is msda_mm's reference: the Triton kernels (interpreted)
    # against it, to fp32 rounding of sums of 4 corners x 2 levels x 2 points.
    from msda_mm.parity import kernel_check
    g = torch.Generator().manual_seed(0)
    shapes = torch.tensor([[3, 4], [2, 2]])
    args = dict(value=torch.randn(1, 16, 2, 4, generator=g).bfloat16(), spatial_shapes=shapes,
                level_start_index=torch.tensor([0, 12]),
                sampling_locations=torch.rand(1, 3, 2, 2, 2, 2, generator=g),
                attention_weights=torch.rand(1, 3, 2, 2, 2, generator=g))
    side = attention.MmcvSide("cuda", load_extension(fake_mmcv_kernels))
    diffs = kernel_check.compare_to_mmcv(args, torch.randn(1, 3, 8, generator=g), side)
    assert set(diffs) == {"output", "grad_value", "grad_loc", "grad_attn"}
    assert all(0 <= d < 1e-6 for d in diffs.values()), diffs
    assert mmcv_cuda_switch.active() is None


@pytest.mark.skipif(not MMCV_LITE, reason="mmcv's own CUDA kernels need no re-routing")
def test_mmcv_side_on_mmcv_lite_uses_mmcv_pytorch_not_triton():
    function = multi_scale_deform_attn.MultiScaleDeformableAttnFunction
    routed = vars(function)["apply"]
    with attention.use_op(TwoLayers(), "mmcv"):
        assert function.apply is attention.mmcv_pytorch_sampler
    assert vars(function)["apply"] is routed
