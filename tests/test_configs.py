"""Every shipped config builds, uses msda_mm's op in every multi-scale
deformable attention, needs no download, and each bf16 config differs from
its fp32 twin only in the optimizer wrapper."""
from pathlib import Path

import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope

from msda_mm.models import TritonMSDeformAttn

# isort: split
# After msda_mm, whose mmcv-lite shims make these importable.
from mmcv.ops import MultiScaleDeformableAttention
from mmdet.registry import MODELS

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ALL = sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.py"))
BF16 = [c for c in ALL if c.endswith("_bf16.py")]


def _load(name: str) -> Config:
    return Config.fromfile(str(CONFIGS / name))


def test_the_documented_configs_ship():
    assert {"dino_bf16.py", "dino_fp32.py", "deformable_detr_bf16.py", "deformable_detr_fp32.py",
            "synthetic/dino_r50_synthetic_bf16.py", "synthetic/dino_tiny_cpu.py"} <= set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_model_builds_with_triton_msda_everywhere(name):
    cfg = _load(name)
    assert "msda_mm" in cfg.custom_imports.imports
    # Nothing may be downloaded at run time.
    assert cfg.model.backbone.init_cfg is None
    init_default_scope("mmdet")
    model = MODELS.build(cfg.model)
    msda = [m for m in model.modules() if isinstance(m, MultiScaleDeformableAttention)]
    assert len(msda) == cfg.model.encoder.num_layers + cfg.model.decoder.num_layers
    assert all(type(m) is TritonMSDeformAttn for m in msda)


@pytest.mark.parametrize("name", BF16)
def test_bf16_config_is_its_fp32_twin_plus_amp(name):
    bf16, fp32 = _load(name).to_dict(), _load(name.replace("_bf16", "_fp32")).to_dict()
    amp, plain = bf16.pop("optim_wrapper"), fp32.pop("optim_wrapper")
    assert bf16 == fp32
    assert (amp.pop("type"), amp.pop("dtype"), plain.pop("type")) == \
        ("AmpOptimWrapper", "bfloat16", "OptimWrapper")
    assert amp == plain


def test_fused_adamw_config_is_dino_bf16_plus_fused():
    fused, base = _load("dino_bf16_fused_adamw.py").to_dict(), _load("dino_bf16.py").to_dict()
    assert fused["optim_wrapper"]["optimizer"].pop("fused") is True
    assert fused == base


def test_compiled_config_is_fast_host_plus_the_compile_hook():
    compiled = _load("dino_bf16_fast_host_compiled.py").to_dict()
    base = _load("dino_bf16_fast_host.py").to_dict()
    assert compiled.pop("custom_hooks") == [dict(type="CompileSubmodulesHook",
                                                 modules=["encoder.layers", "decoder.layers"])]
    assert "custom_hooks" not in base
    assert compiled == base


@pytest.mark.parametrize("name", ALL)
def test_learned_bn_statistics_are_synced_across_ranks(name):
    # Under DDP each rank updates its own BN buffers; a config whose backbone
    # learns them must average them (SyncBuffersHook) or its validation and
    # checkpoint depend on the rank.
    cfg = _load(name)
    backbone = cfg.model.backbone
    learns_bn = backbone.norm_cfg.get("type") == "BN" and not backbone.get("norm_eval", True)
    hooks = {h["type"] for h in cfg.get("custom_hooks", [])}
    assert ("SyncBuffersHook" in hooks) == learns_bn, (name, learns_bn, hooks)


@pytest.mark.parametrize("name", ["synthetic/dino_r50_synthetic_fp32.py",
                                  "synthetic/dino_r50_synthetic_bf16.py"])
def test_synthetic_r50_schedule_warms_the_lr_up_for_200_steps(name):
    # From random weights DINO stalled in about half the runs without it
    # (docs/training.md).  The MultiStepLR stays first:
    # run_e2e.sh reschedules param_scheduler.0.
    multistep, warmup = _load(name).param_scheduler
    assert (multistep.type, multistep.by_epoch, multistep.milestones) == ("MultiStepLR", True, [5])
    assert (warmup.type, warmup.by_epoch, warmup.begin, warmup.end, warmup.start_factor) == \
        ("LinearLR", False, 0, 200, 0.001)
