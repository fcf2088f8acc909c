"""SyncFreeDINO gives mmdet's DINO losses, predictions and denoising queries
bit for bit (CPU, fp32: the same operations on the same numbers, the same
random draws in the same order); on CUDA none of the waits it removes is
left (GPU test)."""
import copy
from pathlib import Path

import pytest
import torch
from mmdet.models.layers import CdnQueryGenerator
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config

from bench.step.syncs import counted_syncs
from msda_mm.models import SyncFreeCdnQueryGenerator, SyncFreeDINO

from .detr_configs import build_detector
from .host_waits import count_host_waits

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# Images of one size (no padding masks) and of three sizes (masks), one
# without any GT box.
BATCHES = {
    "one_size": dict(image_shapes=[(3, 64, 64)] * 2, num_items=[3, 1]),
    "three_sizes": dict(image_shapes=[(3, 64, 64), (3, 48, 64), (3, 64, 48)],
                        num_items=[3, 0, 5]),
}


def tiny_dino(model_type: str, preprocessor_type: str):
    model = Config.fromfile(str(CONFIGS / "synthetic" / "dino_tiny_cpu.py")).model
    model.type = model_type
    model.data_preprocessor.type = preprocessor_type
    return build_detector(model)


def twin_dinos(our_preprocessor: str = "DetDataPreprocessor"):
    """mmdet's DINO and SyncFreeDINO (with ``our_preprocessor``), each built
    and initialised from seed 0: the same random draws give the same
    weights."""
    models = []
    for types in (("DINO", "DetDataPreprocessor"), ("SyncFreeDINO", our_preprocessor)):
        torch.manual_seed(0)
        models.append(tiny_dino(*types))
        models[-1].init_weights()
    theirs, ours = models
    assert type(ours) is SyncFreeDINO
    assert type(ours.dn_query_generator) is SyncFreeCdnQueryGenerator
    theirs_state = theirs.state_dict()
    assert set(ours.state_dict()) == set(theirs_state)
    for name, value in ours.state_dict().items():
        assert torch.equal(value, theirs_state[name]), name
    return theirs, ours


def batch(case: str, num_classes: int = 6):
    return demo_mm_inputs(batch_size=len(BATCHES[case]["num_items"]), num_classes=num_classes,
                          **BATCHES[case])


@pytest.mark.parametrize("preprocessor", ["DetDataPreprocessor", "SyncFreeDetDataPreprocessor"])
@pytest.mark.parametrize("case", sorted(BATCHES))
def test_training_losses_are_dinos(case, preprocessor, reference_backend, quiet_mmengine):
    models = twin_dinos(preprocessor)
    data = batch(case)
    losses = []
    for model in models:
        model.train()
        inputs = model.data_preprocessor(copy.deepcopy(data), training=True)
        torch.manual_seed(1)  # the same denoising queries
        losses.append(model.loss(inputs["inputs"], inputs["data_samples"]))
    assert {"loss_cls", "enc_loss_cls", "dn_loss_bbox", "d1.loss_iou"} <= set(losses[1])
    assert set(losses[0]) == set(losses[1])
    for name in losses[0]:
        assert torch.equal(losses[0][name], losses[1][name]), name


@pytest.mark.parametrize("case", sorted(BATCHES))
def test_predictions_are_dinos(case, reference_backend, quiet_mmengine):
    predictions = []
    for model in twin_dinos():
        model.eval()
        inputs = model.data_preprocessor(batch(case), training=False)
        with torch.no_grad():
            predictions.append(model.predict(inputs["inputs"], inputs["data_samples"]))
    for theirs, ours in zip(*predictions):
        for field in ("scores", "labels", "bboxes"):
            assert torch.equal(getattr(ours.pred_instances, field),
                               getattr(theirs.pred_instances, field)), field


@pytest.mark.parametrize("group_cfg", [dict(dynamic=True, num_dn_queries=20),
                                       dict(dynamic=False, num_groups=3)])
@pytest.mark.parametrize("num_items", [[3, 0, 5], [0, 0], [4]])
def test_denoising_queries_are_mmdets(group_cfg, num_items):
    cfg = dict(num_classes=6, embed_dims=8, num_matching_queries=5, group_cfg=group_cfg)
    torch.manual_seed(0)
    theirs = CdnQueryGenerator(**cfg)
    ours = SyncFreeCdnQueryGenerator(**cfg)
    ours.load_state_dict(theirs.state_dict())
    shapes = [(3, 64 - 8 * i, 48 + 8 * i) for i in range(len(num_items))]
    samples = demo_mm_inputs(batch_size=len(num_items), image_shapes=shapes,
                             num_items=num_items, num_classes=6)["data_samples"]
    outputs = []
    for generator in (theirs, ours):
        torch.manual_seed(1)
        outputs.append(generator(samples))
        outputs[-1] += (torch.rand(1),)  # both took the same number of random draws
    *tensors, meta, after = outputs[1]
    *their_tensors, their_meta, their_after = outputs[0]
    assert meta == their_meta
    assert torch.equal(after, their_after)
    for name, ours_t, theirs_t in zip(("label", "bbox", "mask"), tensors, their_tensors):
        assert ours_t.dtype == theirs_t.dtype, name
        assert torch.equal(ours_t, theirs_t), name


def test_sync_free_config_swaps_only_the_detector_preprocessor_and_loader_pinning():
    ours = Config.fromfile(str(CONFIGS / "dino_bf16_sync_free.py")).to_dict()
    base = Config.fromfile(str(CONFIGS / "dino_bf16_fast_host_compiled.py")).to_dict()
    assert ours["model"].pop("type") == "SyncFreeDINO"
    assert base["model"].pop("type") == "DINO"
    assert ours["model"]["data_preprocessor"].pop("type") == "SyncFreeDetDataPreprocessor"
    assert base["model"]["data_preprocessor"].pop("type") == "DetDataPreprocessor"
    assert ours["train_dataloader"].pop("pin_memory") is True
    assert "pin_memory" not in base["train_dataloader"]
    # The pinning loader's persistent workers are stopped as the run ends.
    assert ours["custom_hooks"].pop() == dict(type="StopLoaderWorkersHook")
    assert ours == base


# Where mmdet's DINO and mmengine's preprocessing wait outside the head's
# matching, as bench.step.syncs names the frames.
REMOVED_FRAMES = ("get_encoder_reference_points", "gen_encoder_output_proposals",
                  "dino_layers.py", "data_preprocessor.py", "base_data_element.py",
                  "base_boxes.py", "sync_free_")
# The one wait SyncFreeCdnQueryGenerator keeps (the label noise's nonzero).
KEPT_FRAME = "generate_dn_label_query"


def _waits_by_frame(model, data):
    model.train()
    device = next(model.parameters()).device
    torch.cuda.synchronize()
    with counted_syncs(device) as counts:
        inputs = model.data_preprocessor(copy.deepcopy(data), training=True)
        losses = model.loss(inputs["inputs"], inputs["data_samples"])
        model.parse_losses(losses)[0].backward()
    return counts


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(BATCHES))
def test_no_waits_outside_the_head_on_cuda(case, quiet_mmengine):
    # One training step of each under sync debug mode: mmdet's DINO waits at
    # the frames above, ours at none of them but the kept nonzero (the head,
    # mmdet's DINOHead here, waits as it does in both).
    theirs, ours = twin_dinos("SyncFreeDetDataPreprocessor")
    data = batch(case)
    their_waits = _waits_by_frame(theirs.cuda(), data)
    our_waits = _waits_by_frame(ours.cuda(), data)
    removed = [f for f in our_waits if any(r in f for r in REMOVED_FRAMES) and KEPT_FRAME not in f]
    assert removed == [], our_waits
    assert sum(our_waits[f] for f in our_waits if KEPT_FRAME in f) <= 1, our_waits
    assert any(any(r in f for r in REMOVED_FRAMES[:4]) for f in their_waits), their_waits


def test_every_query_label_noise_keeps_mmdets_distribution_without_a_wait(monkeypatch):
    """label_noise_draws="every_query": the queries' shapes, dn meta and
    attention mask are mmdet's, each label query is the embedding of a
    class, and the share of labels changed is mmdet's, label_noise_scale / 2
    times (C - 1) / C (a redraw may give the same class), within 5 sigma;
    no wait on the device (with mmdet's draws: their one nonzero)."""
    num_classes, scale, num_items = 4, 0.6, [30, 0, 25]
    cfg = dict(num_classes=num_classes, embed_dims=8, num_matching_queries=5,
               label_noise_scale=scale, group_cfg=dict(dynamic=False, num_groups=100))
    theirs = CdnQueryGenerator(**cfg)
    ours = SyncFreeCdnQueryGenerator(**cfg, label_noise_draws="every_query")
    ours.load_state_dict(theirs.state_dict())
    samples = demo_mm_inputs(batch_size=3, image_shapes=[(3, 64, 48)] * 3, num_items=num_items,
                             num_classes=num_classes)["data_samples"]
    label_query, bbox_query, mask, meta = ours(samples)
    their_label, their_bbox, their_mask, their_meta = theirs(samples)
    assert meta == their_meta and torch.equal(mask, their_mask)
    assert label_query.shape == their_label.shape and bbox_query.shape == their_bbox.shape
    # Which class each query embeds: its nearest row of the embedding table.
    table = ours.label_embedding.weight
    picked = torch.cdist(label_query.flatten(0, 1), table).argmin(1).view(3, -1)
    gts = [s.gt_instances.labels for s in samples]
    step = max(num_items)
    changed = total = 0
    for image, labels in enumerate(gts):
        for group in range(2 * 100):
            slots = picked[image, group * step:group * step + len(labels)]
            changed += int((slots != labels).sum())
            total += len(labels)
    p = scale / 2 * (num_classes - 1) / num_classes
    sigma = (total * p * (1 - p)) ** 0.5
    assert abs(changed - total * p) < 5 * sigma, (changed, total * p, sigma)
    assert count_host_waits(lambda: ours(samples), monkeypatch) == 0
    mmdet_draws = SyncFreeCdnQueryGenerator(**cfg)
    assert count_host_waits(lambda: mmdet_draws(samples), monkeypatch) == 1


def test_label_noise_draws_must_be_known():
    with pytest.raises(ValueError, match="label_noise_draws must be one of"):
        SyncFreeCdnQueryGenerator(num_classes=4, embed_dims=8, num_matching_queries=5,
                                  label_noise_draws="some")


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(BATCHES))
def test_a_training_step_can_wait_nowhere_on_cuda(case, quiet_mmengine):
    # SyncFreeDINO drawing the label noise for every query, its head matching
    # on the device with the sync-free losses: a whole step without a wait.
    model = Config.fromfile(str(CONFIGS / "synthetic" / "dino_tiny_cpu.py")).model
    model.update(type="SyncFreeDINO", label_noise_draws="every_query")
    model.data_preprocessor.type = "SyncFreeDetDataPreprocessor"
    model.bbox_head.update(type="BatchedMatchingDINOHead", device_matching=True,
                           loss_cls=dict(model.bbox_head.loss_cls, type="SyncFreeFocalLoss"),
                           loss_bbox=dict(model.bbox_head.loss_bbox, type="SyncFreeL1Loss"),
                           loss_iou=dict(model.bbox_head.loss_iou, type="SyncFreeGIoULoss"))
    torch.manual_seed(0)
    dino = build_detector(model)
    dino.init_weights()
    waits = _waits_by_frame(dino.cuda(), batch(case))
    assert sum(waits.values()) == 0, waits
