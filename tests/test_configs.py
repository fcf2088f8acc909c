"""Every shipped config builds, uses msda_mm's op in every multi-scale
deformable attention (but the mmcv CUDA baselines, which keep mmcv's module
and switch it to mmcv's kernels), needs no download, each bf16 or fp16
config differs from its fp32 twin only in the optimizer wrapper, and each
is at most MAX_LEVELS `_base_` steps from the mmdet config it builds on."""
import ast
import copy
import functools
from pathlib import Path

import mmdet
import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope

from msda_mm.engine import GraphedDataParallel
from msda_mm.models import TritonMSDeformAttn

# isort: split
# After msda_mm, whose mmcv-lite shims make these importable.
from mmcv.ops import MultiScaleDeformableAttention
from mmdet.registry import MODEL_WRAPPERS, MODELS

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")  # the model builds

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# Every config a user runs; "_" files are fragments other configs take pieces from.
ALL = sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.py")
             if not p.name.startswith("_"))
BF16 = [c for c in ALL if c.endswith("_bf16.py")]
MMCV_CUDA = [c for c in ALL if "mmcv_cuda" in c]
STOCK_DINO = "dino/dino-4scale_r50_8xb2-12e_coco.py"
# The fragment every msda_mm config takes its pieces from (configs built on
# it carry them as top-level variables, which nothing reads).
RECIPE = "_recipe.py"
# A reader follows a config to mmdet's through at most this many files.
MAX_LEVELS = 3


@functools.cache
def _parsed(name: str) -> Config:
    return Config.fromfile(str(CONFIGS / name))


def _load(name: str) -> Config:
    """The config, parsed once (most tests read every config), as a copy of its own."""
    return copy.deepcopy(_parsed(name))


def _deformable_layers(model: Config) -> int:
    """Layers with a multi-scale deformable attention: DETR's encoder and
    decoder, or Mask2Former's pixel decoder."""
    if "panoptic_head" in model:
        return model.panoptic_head.pixel_decoder.encoder.num_layers
    return model.encoder.num_layers + model.decoder.num_layers


def test_the_documented_configs_ship():
    assert {"dino_bf16.py", "dino_fp32.py", "deformable_detr_bf16.py", "deformable_detr_fp32.py",
            "mask2former_r50_bf16.py", "synthetic/dino_r50_synthetic_bf16.py",
            "synthetic/dino_tiny_cpu.py"} <= set(ALL)


def _msda_of_model(cfg: Config) -> list:
    assert "msda_mm" in cfg.custom_imports.imports
    # Nothing may be downloaded at run time.
    assert cfg.model.backbone.init_cfg is None
    init_default_scope("mmdet")
    model = MODELS.build(cfg.model)
    msda = [m for m in model.modules() if isinstance(m, MultiScaleDeformableAttention)]
    assert len(msda) == _deformable_layers(cfg.model)
    return msda


@pytest.mark.parametrize("name", [c for c in ALL if c not in MMCV_CUDA])
def test_model_builds_with_triton_msda_everywhere(name):
    assert all(type(m) is TritonMSDeformAttn for m in _msda_of_model(_load(name)))


@pytest.mark.parametrize("name", MMCV_CUDA)
def test_mmcv_cuda_baseline_keeps_mmcvs_module_and_switches_its_kernels(name):
    cfg = _load(name)
    assert "msda_mm.compat.with_mmcv_cuda" in cfg.custom_imports.imports
    assert all(type(m) is MultiScaleDeformableAttention for m in _msda_of_model(cfg))


def _unscoped(value):
    # A base named 'mmdet::...' tags each of its dicts with _scope_='mmdet'.
    if isinstance(value, dict):
        return {k: _unscoped(v) for k, v in value.items() if k != "_scope_"}
    if isinstance(value, (list, tuple)):
        return type(value)(_unscoped(v) for v in value)
    return value


def test_mmcv_cuda_baseline_is_mmdets_dino_but_for_downloads_and_checkpoints():
    stock = Config.fromfile(str(Path(mmdet.__file__).parent / ".mim/configs" / STOCK_DINO))
    stock = stock.to_dict()
    ours = _unscoped(_load("dino_mmcv_cuda_fp32.py").to_dict())
    for name, piece in _load(RECIPE).to_dict().items():
        assert ours.pop(name) == piece, name
    assert ours.pop("custom_imports")["imports"] == ["msda_mm", "msda_mm.compat.with_mmcv_cuda"]
    assert ours["model"]["backbone"].pop("init_cfg") is None
    stock["model"]["backbone"].pop("init_cfg")
    assert ours["default_hooks"]["checkpoint"].pop("type") == "VerifiedCheckpointHook"
    assert stock["default_hooks"]["checkpoint"].pop("type") == "CheckpointHook"
    assert ours == stock


def test_mmcv_cuda_fp16_config_is_its_fp32_twin_plus_amp():
    fp16 = _load("dino_mmcv_cuda_fp16.py").to_dict()
    fp32 = _load("dino_mmcv_cuda_fp32.py").to_dict()
    amp, plain = fp16.pop("optim_wrapper"), fp32.pop("optim_wrapper")
    assert fp16 == fp32
    assert (amp.pop("type"), amp.pop("dtype"), amp.pop("loss_scale"), plain.pop("type")) == \
        ("AmpOptimWrapper", "float16", "dynamic", "OptimWrapper")
    assert amp == plain


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


def test_compiled_losses_config_is_compiled_plus_the_sync_free_losses():
    ours = _load("dino_bf16_compiled_losses.py").to_dict()
    base = _load("dino_bf16_fast_host_compiled.py").to_dict()
    head, base_head = ours["model"]["bbox_head"], base["model"]["bbox_head"]
    assert head.pop("compile_losses") is True and "compile_losses" not in base_head
    for name in ("loss_cls", "loss_bbox", "loss_iou"):
        # The sync-free twin, with mmdet's DINO parameters kept.
        assert head[name].pop("type") == "SyncFree" + base_head[name].pop("type")
    assert ours == base


def test_fastest_config_is_sync_free_with_the_compiled_losses_head():
    fastest = _load("dino_bf16_fastest.py").to_dict()
    sync_free = _load("dino_bf16_sync_free.py").to_dict()
    losses = _load("dino_bf16_compiled_losses.py").to_dict()
    assert fastest["model"].pop("bbox_head") == losses["model"]["bbox_head"]
    sync_free["model"].pop("bbox_head")
    assert fastest == sync_free


def test_graphed_configs_take_the_graphed_wrapper():
    # Under DDP, mmengine's default wrapper would run GraphedDINO's loss
    # eagerly instead of its captured step.
    graphed = [name for name in ALL if _load(name).model.type == "GraphedDINO"]
    assert len(graphed) == 4
    for name in graphed:
        assert _load(name).model_wrapper_cfg == dict(type="GraphedDataParallel"), name
    assert MODEL_WRAPPERS.get("GraphedDataParallel") is GraphedDataParallel


def test_graphed_configs_of_one_canvas_compile_each_shape_on_its_own():
    # Then an eager step of a key runs the kernels its graph replays, and under
    # deterministic algorithms a graphed run is the eager run bit for bit
    # (docs/training.md); many canvases would pass torch.compile's recompile limit.
    graphed = {name: cfg for name in ALL if (cfg := _parsed(name)).model.type == "GraphedDINO"}
    static = {name for name, cfg in graphed.items()
              for hook in cfg.custom_hooks if hook["type"] == "CompileSubmodulesHook"
              and hook.get("dynamic") is False}
    one_canvas = {name for name, cfg in graphed.items() if len(cfg.model.canvas_sizes) == 1}
    assert static == one_canvas == {"synthetic/dino_r50_synthetic_graphed.py",
                                    "synthetic/dino_tiny_graphed.py"}


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


@pytest.mark.parametrize("name", ALL)
def test_pinning_persistent_loaders_have_their_workers_stopped_at_the_end(name):
    # At exit torch 2.11 waits 5 s for each persistent worker of a pinning
    # loader that is still running (msda_mm/engine/stop_loader_workers_hook.py).
    cfg = _load(name)
    loaders = [cfg.get(f"{split}_dataloader") or {} for split in ("train", "val", "test")]
    pins = any(loader.get("pin_memory") and loader.get("persistent_workers")
               and loader.get("num_workers", 0) > 0 for loader in loaders)
    hooks = {h["type"] for h in cfg.get("custom_hooks", [])}
    assert ("StopLoaderWorkersHook" in hooks) == pins, (name, pins, hooks)


@pytest.mark.parametrize("name", ["synthetic/dino_r50_synthetic_fp32.py",
                                  "synthetic/dino_r50_synthetic_bf16.py"])
def test_synthetic_r50_schedule_warms_the_lr_up_for_200_steps(name):
    # From random weights DINO stalled in about half the runs without it
    # (docs/training.md).  The MultiStepLR stays first:
    # tools/run_e2e.py reschedules param_scheduler.0.
    multistep, warmup = _load(name).param_scheduler
    assert (multistep.type, multistep.by_epoch, multistep.milestones) == ("MultiStepLR", True, [5])
    assert (warmup.type, warmup.by_epoch, warmup.begin, warmup.end, warmup.start_factor) == \
        ("LinearLR", False, 0, 200, 0.001)


@pytest.mark.parametrize("name", ALL)
def test_checkpoints_are_saved_and_checked_by_the_verified_hook(name):
    assert _load(name).default_hooks.checkpoint.type == "VerifiedCheckpointHook"


def test_the_demo_checkpoints_every_epoch_and_keeps_a_few():
    checkpoint = _load("synthetic/dino_tiny_cpu.py").default_hooks.checkpoint
    assert checkpoint.interval == 1 and 2 <= checkpoint.max_keep_ckpts <= 5


def _changes(base: dict, ours: dict) -> dict:
    """What ``ours`` sets that ``base`` does not have or has otherwise,
    nested dicts compared key by key."""
    return {k: (_changes(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict)
                else v) for k, v in ours.items() if base.get(k) != v}


# The synthetic configs with the fastest recipe and the configs they build on.
SYNTHETIC_FASTEST = {
    "synthetic/dino_r50_synthetic_fastest.py": "synthetic/dino_r50_synthetic_bf16.py",
    "synthetic/dino_tiny_fastest.py": "synthetic/dino_tiny_cpu.py"}


@pytest.mark.parametrize("name", sorted(SYNTHETIC_FASTEST))
def test_synthetic_fastest_configs_change_what_the_fastest_recipe_changes(name):
    # The fastest recipe is what dino_bf16_fastest.py changes against dino_bf16.py; the
    # synthetic twins change the same keys of their own bases (besides their hooks).
    recipe = _changes(_load("dino_bf16.py").to_dict(), _load("dino_bf16_fastest.py").to_dict())
    changes = _changes(_load(SYNTHETIC_FASTEST[name]).to_dict(), _load(name).to_dict())
    hooks = {h["type"] for h in changes.pop("custom_hooks", [])}
    # Whether a config stops its loader's workers follows its loader (tested above).
    assert {h["type"] for h in recipe.pop("custom_hooks")} - {"StopLoaderWorkersHook"} <= hooks
    recipe_model, model = recipe.pop("model"), changes.pop("model")
    assert model == recipe_model
    optim = changes.pop("optim_wrapper")
    assert optim.items() >= recipe.pop("optim_wrapper").items()
    assert changes.items() >= recipe.items()


def _bases(config: Path) -> list:
    """The ``_base_`` entries of ``config``, as mmengine reads them."""
    for node in ast.parse(config.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "_base_" for target in node.targets):
            bases = ast.literal_eval(node.value)
            return [bases] if isinstance(bases, str) else list(bases)
    return []


def _levels_from_mmdet(config: Path):
    """The most ``_base_`` steps from ``config`` to an ``mmdet::`` config
    (1: it names one itself); None where no base leads to one (a fragment)."""
    levels = []
    for base in _bases(config):
        below = 0 if "::" in base else _levels_from_mmdet(config.parent / base)
        if below is not None:
            levels.append(below + 1)
    return max(levels, default=None)


@pytest.mark.parametrize("name", ALL)
def test_config_is_at_most_max_levels_from_mmdets(name):
    levels = _levels_from_mmdet(CONFIGS / name)
    assert levels is not None and levels <= MAX_LEVELS, (name, levels)


def test_the_level_count_refuses_a_4_level_chain(tmp_path):
    chain = ["a.py", "b.py", "c.py", "d.py", f"mmdet::{STOCK_DINO}"]
    for config, base in zip(chain, chain[1:]):
        (tmp_path / config).write_text(f"_base_ = '{base if '::' in base else './' + base}'\n")
    # A fragment beside a base adds no level; the deepest base counts.
    (tmp_path / "_pieces.py").write_text("pieces = dict(a=1)\n")
    (tmp_path / "e.py").write_text("_base_ = ['./c.py', './_pieces.py', './b.py']\n")
    assert [_levels_from_mmdet(tmp_path / c) for c in ("d.py", "c.py", "b.py", "e.py")] == \
        [1, 2, 3, 4]
    assert _levels_from_mmdet(tmp_path / "_pieces.py") is None
    assert _levels_from_mmdet(tmp_path / "a.py") == 4 > MAX_LEVELS
