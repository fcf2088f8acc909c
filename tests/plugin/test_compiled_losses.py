"""BatchedMatchingDINOHead(compile_losses=True): the losses of a tiny DINO
step, forward and backward, as one compiled graph per output, equal to the
eager head's within fp32 reordering (CPU; inductor compiles in tens of
seconds, hence one model test)."""
import copy
from pathlib import Path

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config
from mmengine.registry import DefaultScope

from msda_mm.models import BatchedMatchingDINOHead

from .detr_configs import build_detector, detr_model_cfg

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# Not DINO's defaults, to show the configured parameters reach the compiled losses.
LOSSES = dict(loss_cls=dict(type="FocalLoss", use_sigmoid=True, gamma=1.5, alpha=0.3,
                            loss_weight=1.5),
              loss_bbox=dict(type="L1Loss", loss_weight=4.0),
              loss_iou=dict(type="SyncFreeGIoULoss", loss_weight=2.5, eps=1e-4))
# Compiled code sums in another order and fuses (no intermediate rounding):
# each loss is a sum of at most ~2k fp32 terms of size ~1, whose reordering
# moves it by a few ulps; 1e-5 relative is ~80 ulps of fp32.
RTOL, ATOL = 1e-5, 1e-6


def tiny_dino(compile_losses: bool):
    model = Config.fromfile(str(CONFIGS / "synthetic" / "dino_tiny_cpu.py")).model
    model.bbox_head.update(type="BatchedMatchingDINOHead", compile_losses=compile_losses,
                           **copy.deepcopy(LOSSES))
    return build_detector(model)


def test_compiled_losses_are_the_eager_ones(reference_backend, quiet_mmengine, monkeypatch):
    compiled = []
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile",
                        lambda fn, **kwargs: compiled.append(kwargs) or compile_(fn, **kwargs))
    torch.manual_seed(0)
    eager = tiny_dino(False)
    eager.init_weights()
    ours = tiny_dino(True)
    ours.load_state_dict(eager.state_dict())
    assert ours.bbox_head.compile_losses and not compiled  # compiled at first use
    batch = demo_mm_inputs(batch_size=2, image_shapes=[(3, 64, 64), (3, 48, 64)],
                           num_items=[3, 2], num_classes=6)
    results = []
    for model in (eager, ours):
        model.train()
        data = model.data_preprocessor(copy.deepcopy(batch), training=True)
        torch.manual_seed(1)  # the same denoising queries
        losses = model.loss(data["inputs"], data["data_samples"])
        sum(losses.values()).backward()
        results.append((losses, {name: p.grad for name, p in model.named_parameters()
                                 if p.grad is not None}))
    # One compile for the head, of one graph (a graph break would raise).
    assert compiled == [dict(dynamic=True, fullgraph=True)]
    (eager_losses, eager_grads), (our_losses, our_grads) = results
    assert set(our_losses) == set(eager_losses)
    assert {"loss_cls", "loss_bbox", "loss_iou", "enc_loss_iou", "d0.dn_loss_iou"} <= \
        set(our_losses)
    for name, value in eager_losses.items():
        assert our_losses[name].dtype == value.dtype and our_losses[name].shape == value.shape
        torch.testing.assert_close(our_losses[name], value, rtol=RTOL, atol=ATOL, msg=name)
    assert set(our_grads) == set(eager_grads)
    for name, grad in eager_grads.items():
        # Gradients pass through the whole model: 1e-4 relative to the largest.
        scale = grad.abs().max().item()
        torch.testing.assert_close(our_grads[name], grad, rtol=1e-4, atol=1e-4 * scale,
                                   msg=name)


@pytest.mark.parametrize("role, loss, message", [
    ("loss_cls", dict(type="QualityFocalLoss", use_sigmoid=True, beta=2.0),
     "loss_cls must be FocalLoss or SyncFreeFocalLoss to be compiled, got QualityFocalLoss"),
    ("loss_bbox", dict(type="SmoothL1Loss"),
     "loss_bbox must be L1Loss or SyncFreeL1Loss to be compiled, got SmoothL1Loss"),
    ("loss_iou", dict(type="IoULoss"),
     "loss_iou must be GIoULoss or SyncFreeGIoULoss to be compiled, got IoULoss"),
])
def test_unsupported_losses_are_refused(role, loss, message):
    def model(compile_losses):
        cfg = Config.fromfile(str(CONFIGS / "synthetic" / "dino_tiny_cpu.py")).model
        cfg.bbox_head.update(type="BatchedMatchingDINOHead", compile_losses=compile_losses)
        cfg.bbox_head[role] = loss  # in place of the config's, not merged into it
        return build_detector(cfg)

    with pytest.raises(ValueError, match=message):
        model(True)
    assert type(model(False).bbox_head) is BatchedMatchingDINOHead  # eager: any loss goes


def dn_inputs(device, dtype=torch.float32, num_gts=(3, 0, 2, 1), groups=5, seed=0):
    """A batch's GT boxes on ``device`` and one denoising output for them in
    ``dtype``: (scores (B, D, C), boxes (B, D, 4), gt instances, img metas,
    dn_meta)."""
    from mmengine.structures import InstanceData

    gen = torch.Generator().manual_seed(seed)
    gts, metas = [], []
    for i, num in enumerate(num_gts):
        corner = torch.rand(num, 2, generator=gen) * 0.6
        size = torch.rand(num, 2, generator=gen) * 0.3 + 0.05
        gts.append(InstanceData(bboxes=(torch.cat([corner, corner + size], 1) * 64).to(device),
                                labels=torch.randint(5, (num,), generator=gen).to(device)))
        metas.append(dict(img_shape=(64, 64 - 8 * i)))
    num_dn = groups * 2 * max(num_gts)
    meta = dict(num_denoising_groups=groups, num_denoising_queries=num_dn)
    scores = torch.randn(len(gts), num_dn, 5, generator=gen).to(device, dtype)
    boxes = (torch.rand(len(gts), num_dn, 4, generator=gen) * 0.5 + 0.1).to(device, dtype)
    return scores, boxes, gts, metas, meta


def dino_head(compile_losses: bool, losses: dict, device="cuda"):
    dino = detr_model_cfg("dino-4scale")
    cfg = dict(dino.bbox_head, num_classes=5, train_cfg=copy.deepcopy(dino.train_cfg),
               type="BatchedMatchingDINOHead", compile_losses=compile_losses, **losses)
    with DefaultScope.overwrite_default_scope("mmdet"):
        return MODELS.build(cfg).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_gts, groups", [((3, 0, 2, 1), 5), ((0, 0), 3),
                                             ((3, 4), 43)])  # 301 positives: not a bf16 number
@pytest.mark.parametrize("sync_cls_avg_factor", [True, False])  # (1,) tensor or float
def test_compiled_path_is_mmdets_before_compiling(dtype, num_gts, groups, sync_cls_avg_factor,
                                                  monkeypatch):
    # What compile_losses compiles, run eagerly (torch.compile as identity):
    # mmdet's DINOHead losses bit for bit in every dtype, so the normalisers
    # (their dtype known before the focal loss is computed) and the losses
    # built from the configured ones are mmdet's; compiling only reorders.
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    head = dino_head(True, {}, device="cpu")
    cfg = dict(detr_model_cfg("dino-4scale").bbox_head, num_classes=5, type="DINOHead")
    with DefaultScope.overwrite_default_scope("mmdet"):
        mmdet_head = MODELS.build(cfg)
    head.sync_cls_avg_factor = mmdet_head.sync_cls_avg_factor = sync_cls_avg_factor
    inputs = dn_inputs("cpu", dtype, num_gts, groups)
    for x, y in zip(head._loss_dn_single(*inputs), mmdet_head._loss_dn_single(*inputs)):
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)


def test_many_output_dtypes_and_sizes_compile_without_failing(monkeypatch):
    # Under AMP the outputs come in several dtypes; each dtype and layout is a
    # graph of its own, more than dynamo's default 8 for a function, which
    # failed the fullgraph compile.  New GT counts of the same sizes reuse a
    # graph (a float normaliser is no specialised constant).  Dynamo alone (the eager
    # backend) decides what compiles.
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile",
                        lambda fn, **kwargs: compile_(fn, backend="eager", **kwargs))
    head = dino_head(True, {}, device="cpu")
    torch._dynamo.reset()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for sync_cls_avg_factor in (True, False):
            head.sync_cls_avg_factor = sync_cls_avg_factor
            for num_gts in ((3, 0, 2, 1), (1, 1)):
                head._loss_dn_single(*dn_inputs("cpu", dtype, num_gts, groups=5))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 8
    with torch._dynamo.config.patch(error_on_recompile=True):
        head._loss_dn_single(*dn_inputs("cpu", torch.bfloat16, (3, 2, 3, 1), groups=5))


def test_compiled_losses_take_no_float_argument(monkeypatch):
    # torch 2.11's dynamo specialised a float argument (a graph per GT count:
    # 78 recompiles in 10 steps of DINO at batch 8 on the H200); ints stay
    # symbolic, so the normalisers go in as exact integer ratios.
    seen = []
    compile_ = torch.compile

    def spy(fn, **kwargs):
        compiled = compile_(fn, backend="eager", **kwargs)
        return lambda *args: seen.append(args[-2:]) or compiled(*args)

    monkeypatch.setattr(torch, "compile", spy)
    head = dino_head(True, {}, device="cpu")
    for sync_cls_avg_factor in (True, False):  # (1,) tensor or float
        head.sync_cls_avg_factor = sync_cls_avg_factor
        head._loss_dn_single(*dn_inputs("cpu", torch.bfloat16, (3, 4), groups=43))
    values = [v for args in seen for a in args for v in (a if isinstance(a, tuple) else (a,))]
    assert len(seen) == 2 and not any(isinstance(v, float) for v in values)
    assert any(isinstance(a, tuple) for args in seen for a in args)


SYNC_FREE = dict(loss_cls=dict(type="SyncFreeFocalLoss", gamma=2.0, alpha=0.25),
                 loss_bbox=dict(type="SyncFreeL1Loss", loss_weight=5.0),
                 loss_iou=dict(type="SyncFreeGIoULoss", loss_weight=2.0))


@pytest.mark.gpu
def test_denoising_losses_do_not_wait_on_cuda():
    # A denoising output's targets and losses, eager with the sync-free
    # losses and compiled, run under CUDA's sync debug mode "error" (any
    # wait raises); with mmdet's L1Loss and GIoULoss they wait (2 + 1 a call).
    inputs = dn_inputs("cuda")
    eager, compiled, mmdets = (dino_head(False, SYNC_FREE), dino_head(True, {}),
                               dino_head(False, {}))
    compiled._loss_dn_single(*inputs)  # compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ours = [head._loss_dn_single(*inputs) for head in (eager, compiled)]
        with pytest.raises(RuntimeError, match="synchroniz"):
            mmdets._loss_dn_single(*inputs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for x, y in zip(*ours):
        torch.testing.assert_close(y, x, rtol=RTOL, atol=ATOL)
