"""BatchedMatchingDINOHead gives mmdet's DINOHead targets and losses with one
device-to-host transfer per matched output, and its denoising targets with
none (CPU, fp32)."""
import copy
from pathlib import Path

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmengine.structures import InstanceData
from torch.profiler import ProfilerActivity, profile

from msda_mm.models import BatchedMatchingDINOHead
from msda_mm.models.dino.matching import l1_distances

from .detr_configs import build_detector, detr_model_cfg
from .host_waits import count_host_waits

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
NUM_CLASSES = 5
MATCH_COSTS = {
    # DINO's (sigmoid classification) and DETR's (softmax) costs.
    "focal": None,  # the DINO config's own train_cfg.assigner
    "softmax": [dict(type="ClassificationCost", weight=1.0),
                dict(type="BBoxL1Cost", weight=5.0, box_format="xywh"),
                dict(type="IoUCost", iou_mode="giou", weight=2.0)],
}


def build_heads(costs: str):
    """mmdet's DINOHead and BatchedMatchingDINOHead, built from DINO's config."""
    dino = detr_model_cfg("dino-4scale")
    head = dict(dino.bbox_head, num_classes=NUM_CLASSES, train_cfg=copy.deepcopy(dino.train_cfg))
    if MATCH_COSTS[costs] is not None:
        head["train_cfg"]["assigner"]["match_costs"] = MATCH_COSTS[costs]
    with DefaultScope.overwrite_default_scope("mmdet"):
        return (MODELS.build(dict(head, type="DINOHead")),
                MODELS.build(dict(head, type="BatchedMatchingDINOHead")))


def random_output(num_gts, num_queries=6, tied=False, seed=0):
    """One decoder output and its batch: per image (Q, C+1) logits, (Q, 4)
    normalised (cx, cy, w, h), GT boxes in pixels and image metas of
    different sizes.  ``tied``: identical queries and a duplicated GT, so
    that whole rows and columns of the cost matrix are equal."""
    gen = torch.Generator().manual_seed(seed)
    scores, boxes, gts, metas = [], [], [], []
    for i, num in enumerate(num_gts):
        h, w = 64 + 16 * i, 96 - 8 * i
        score = torch.randn(num_queries, NUM_CLASSES + 1, generator=gen)
        box = torch.rand(num_queries, 4, generator=gen) * 0.5 + 0.1
        corner = torch.rand(num, 2, generator=gen) * 0.6
        size = torch.rand(num, 2, generator=gen) * 0.3 + 0.05
        gt_boxes = torch.cat([corner, corner + size], 1) * torch.tensor([w, h, w, h])
        labels = torch.randint(NUM_CLASSES, (num,), generator=gen)
        if tied:
            score, box = score[:1].expand_as(score), box[:1].expand_as(box)
            gt_boxes[1:2], labels[1:2] = gt_boxes[:1], labels[:1]
        scores.append(score)
        boxes.append(box)
        gts.append(InstanceData(bboxes=gt_boxes, labels=labels))
        metas.append(dict(img_shape=(h, w)))
    return scores, boxes, gts, metas


CASES = {
    "mixed": dict(num_gts=[3, 0, 2, 1]),
    "more_gts_than_queries": dict(num_gts=[9, 4], num_queries=6),
    "no_gts": dict(num_gts=[0, 0]),
    "ties": dict(num_gts=[4, 3], tied=True),
    "one_image": dict(num_gts=[5]),
}


def assert_same_targets(ours, theirs):
    *ours_lists, ours_pos, ours_neg = ours
    *their_lists, their_pos, their_neg = theirs
    assert (ours_pos, ours_neg) == (their_pos, their_neg)
    for name, a, b in zip(("labels", "label_weights", "bbox_targets", "bbox_weights"),
                          ours_lists, their_lists):
        assert len(a) == len(b), name
        for img, (x, y) in enumerate(zip(a, b)):
            assert x.dtype == y.dtype and torch.equal(x, y), f"{name} of image {img}"


def as_dtype(inputs, dtype):
    """The predictions (scores, boxes) in ``dtype``, as under AMP; GT stays fp32."""
    scores, boxes, gts, metas = inputs
    return [s.to(dtype) for s in scores], [b.to(dtype) for b in boxes], gts, metas


# fp16 predictions: DETRHead's image-size factor is then fp16 and IoUCost
# upcasts to fp32, while the GT boxes stay fp32.  bf16 is not tested against
# mmdet: its HungarianAssigner would hand scipy a bf16 array, which numpy
# does not have.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("costs", sorted(MATCH_COSTS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_targets_are_mmdets(costs, case, dtype):
    mmdet_head, head = build_heads(costs)
    for seed in range(3):
        inputs = as_dtype(random_output(**CASES[case], seed=seed), dtype)
        assert_same_targets(head.get_targets(*inputs), mmdet_head.get_targets(*inputs))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_l1_distances_are_cdists_in_at_least_fp32(dtype):
    gen = torch.Generator().manual_seed(0)
    rows, cols = torch.rand(37, 4, generator=gen), torch.rand(5, 4, generator=gen)
    got = l1_distances(rows.to(dtype), cols.to(dtype))
    # What autocast's cdist computes: the inputs rounded to dtype, then fp32 (fp64 kept).
    expected = torch.cdist(rows.to(dtype).double(), cols.to(dtype).double(), p=1)
    assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    # Four terms summed in the result's dtype: a few of its ulps.
    torch.testing.assert_close(got.double(), expected, rtol=4 * torch.finfo(got.dtype).eps,
                               atol=0)
    assert l1_distances(rows, cols[:0]).shape == (37, 0)


@pytest.mark.parametrize("num_gts, ours_expected", [([3, 0, 2, 1], 1), ([5], 1), ([0, 0], 0)])
def test_host_waits_per_output_do_not_grow_with_the_batch(num_gts, ours_expected, monkeypatch):
    mmdet_head, head = build_heads("focal")
    inputs = random_output(num_gts)
    theirs = count_host_waits(lambda: mmdet_head.get_targets(*inputs), monkeypatch)
    ours = count_host_waits(lambda: head.get_targets(*inputs), monkeypatch)
    # mmdet, per image: its image-size factor, 2 nonzero and 2 unique, and
    # with GTs cost.cpu() and the match costs' image size and IoU epsilon.
    assert theirs >= 5 * len(num_gts)
    # Ours, per call: the packed costs' .cpu() (the L1 cost divides by no
    # device copy, the IoU cost's epsilon is a Python float); nothing
    # without GTs.
    assert ours == ours_expected


def dn_meta(num_gts, groups=3, spare=0):
    """CdnQueryGenerator's sizes: groups of twice the most GTs of an image
    (no query at all without GTs); ``spare`` more queries than the groups
    divide evenly (mmdet rounds the group size down)."""
    per_group = 2 * max(num_gts)
    return dict(num_denoising_groups=groups,
                num_denoising_queries=groups * per_group + spare if per_group else 0)


@pytest.mark.parametrize("groups, spare", [(1, 0), (5, 0), (3, 2)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_dn_targets_are_mmdets_without_host_waits(case, groups, spare, monkeypatch):
    mmdet_head, head = build_heads("focal")
    _, _, gts, metas = random_output(**CASES[case])
    meta = dn_meta(CASES[case]["num_gts"], groups, spare)
    assert_same_targets(head.get_dn_targets(gts, metas, meta),
                        mmdet_head.get_dn_targets(gts, metas, meta))
    # mmdet's, per image: its image-size factor (and an uncounted scalar
    # copy; without GTs an empty index tensor too).
    theirs = count_host_waits(lambda: mmdet_head.get_dn_targets(gts, metas, meta), monkeypatch)
    assert theirs >= len(gts)
    assert count_host_waits(lambda: head.get_dn_targets(gts, metas, meta), monkeypatch) == 0


def test_dn_targets_refuse_groups_too_small_for_the_gts():
    _, head = build_heads("focal")
    _, _, gts, metas = random_output([3, 5])
    with pytest.raises(ValueError, match="room for 4 GT boxes an image; an image has 5"):
        head.get_dn_targets(gts, metas, dict(num_denoising_groups=2, num_denoising_queries=16))


def test_bad_input_is_refused():
    _, head = build_heads("focal")
    scores, boxes, gts, metas = random_output([1, 2])
    with pytest.raises(ValueError, match="one entry per image"):
        head.get_targets(scores, boxes, gts[:1], metas)
    with pytest.raises(ValueError, match="at least one image"):
        head.get_targets([], [], [], [])
    dino = detr_model_cfg("dino-4scale")
    with DefaultScope.overwrite_default_scope("mmdet"), pytest.raises(TypeError, match="Hungarian"):
        MODELS.build(dict(dino.bbox_head, type="BatchedMatchingDINOHead",
                          train_cfg=dict(assigner=dict(type="TaskAlignedAssigner", topk=3))))
    # A cost that is not computed pair by pair from boxes and scores.
    for cost, message in ((dict(type="DiceCost"), "has DiceCost"),
                          (dict(type="FocalLossCost", binary_input=True), "binary_input=True")):
        assigner = dict(type="HungarianAssigner", match_costs=[cost])
        with DefaultScope.overwrite_default_scope("mmdet"), \
                pytest.raises(TypeError, match=message):
            MODELS.build(dict(dino.bbox_head, type="BatchedMatchingDINOHead",
                              train_cfg=dict(assigner=assigner)))


def assert_same_losses(ours, theirs):
    for name, x, y in zip(("loss_cls", "loss_bbox", "loss_iou"), ours, theirs):
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name


def stacked(inputs):
    """random_output's per-image predictions as (B, Q, ...) tensors, the
    scores of the focal-loss heads (no background logit)."""
    scores, boxes, gts, metas = inputs
    return torch.stack(scores)[..., :NUM_CLASSES], torch.stack(boxes), gts, metas


def with_targets(head, name, targets, monkeypatch):
    """``head`` with its target method ``name`` answering ``targets``."""
    monkeypatch.setattr(head, name, lambda *args: targets)
    return head


@pytest.mark.parametrize("sync_cls_avg_factor", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matched_losses_are_mmdets_with_fewer_host_waits(case, dtype, sync_cls_avg_factor,
                                                         monkeypatch):
    mmdet_head, head = build_heads("focal")
    mmdet_head.sync_cls_avg_factor = head.sync_cls_avg_factor = sync_cls_avg_factor
    inputs = stacked(as_dtype(random_output(**CASES[case]), dtype))
    assert_same_losses(head.loss_by_feat_single(*inputs), mmdet_head.loss_by_feat_single(*inputs))
    # The losses alone, from the same targets: mmdet copies a Python number
    # to the device for each image's factor, for the GT count and, if
    # synchronised, for the classification normaliser (on CUDA each waits,
    # and so does each normaliser's read: tests the GPU test below).
    targets = head.get_targets(list(inputs[0]), list(inputs[1]), *inputs[2:])
    waits = [count_host_waits(lambda h=h: with_targets(h, "get_targets", targets, monkeypatch)
                              .loss_by_feat_single(*inputs), monkeypatch)
             for h in (mmdet_head, head)]
    assert waits[0] - waits[1] == len(inputs[2]) + 1 + sync_cls_avg_factor, waits


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_gts, groups", [([3, 0, 2, 1], 5), ([0, 0], 3),
                                             # 301 positives: not a bfloat16 number
                                             ([3, 4], 43)])
def test_dn_losses_are_mmdets_with_fewer_host_waits(num_gts, groups, dtype, monkeypatch):
    mmdet_head, head = build_heads("focal")
    _, _, gts, metas = random_output(num_gts)
    meta = dn_meta(num_gts, groups)
    gen = torch.Generator().manual_seed(0)
    num_dn = meta["num_denoising_queries"]
    scores = torch.randn(len(gts), num_dn, NUM_CLASSES, generator=gen).to(dtype)
    boxes = (torch.rand(len(gts), num_dn, 4, generator=gen) * 0.5 + 0.1).to(dtype)
    inputs = (scores, boxes, gts, metas, meta)
    assert_same_losses(head._loss_dn_single(*inputs), mmdet_head._loss_dn_single(*inputs))
    targets = head.get_dn_targets(gts, metas, meta)
    waits = [count_host_waits(lambda h=h: with_targets(h, "get_dn_targets", targets, monkeypatch)
                              ._loss_dn_single(*inputs), monkeypatch)
             for h in (mmdet_head, head)]
    assert waits[0] - waits[1] == len(gts) + 2, waits


def test_quality_focal_loss_goes_through_mmdets_losses():
    qfl = dict(type="QualityFocalLoss", use_sigmoid=True, beta=2.0, loss_weight=1.0)
    dino = detr_model_cfg("dino-4scale")
    head_cfg = dict(dino.bbox_head, num_classes=NUM_CLASSES, loss_cls=qfl,
                    train_cfg=copy.deepcopy(dino.train_cfg))
    with DefaultScope.overwrite_default_scope("mmdet"):
        mmdet_head, head = (MODELS.build(dict(head_cfg, type=t))
                            for t in ("DINOHead", "BatchedMatchingDINOHead"))
    inputs = stacked(random_output([3, 0, 2, 1]))
    assert_same_losses(head.loss_by_feat_single(*inputs), mmdet_head.loss_by_feat_single(*inputs))
    meta = dn_meta([3, 0, 2, 1])
    dn = (torch.randn(4, meta["num_denoising_queries"], NUM_CLASSES),
          torch.rand(4, meta["num_denoising_queries"], 4) * 0.5 + 0.1)
    assert_same_losses(head._loss_dn_single(*dn, *inputs[2:], meta),
                       mmdet_head._loss_dn_single(*dn, *inputs[2:], meta))


def tiny_dino(head_type: str):
    model = Config.fromfile(str(CONFIGS / "synthetic" / "dino_tiny_cpu.py")).model
    model.bbox_head.type = head_type
    return build_detector(model)


def test_training_step_losses_are_mmdets(reference_backend, quiet_mmengine, monkeypatch):
    matched = []
    get_targets = BatchedMatchingDINOHead.get_targets
    monkeypatch.setattr(BatchedMatchingDINOHead, "get_targets",
                        lambda *args: matched.append(1) or get_targets(*args))
    torch.manual_seed(0)
    theirs = tiny_dino("DINOHead")
    theirs.init_weights()
    ours = tiny_dino("BatchedMatchingDINOHead")
    ours.load_state_dict(theirs.state_dict())
    assert type(ours.bbox_head) is BatchedMatchingDINOHead
    batch = demo_mm_inputs(batch_size=3, image_shapes=[(3, 64, 64), (3, 48, 64), (3, 64, 48)],
                           num_items=[3, 0, 5], num_classes=6)
    losses = []
    for model in (theirs, ours):
        model.train()
        data = model.data_preprocessor(copy.deepcopy(batch), training=True)
        torch.manual_seed(1)  # the same denoising queries
        losses.append(model.loss(data["inputs"], data["data_samples"]))
    assert set(losses[0]) == set(losses[1])
    assert {"loss_cls", "loss_bbox", "loss_iou", "enc_loss_cls", "d0.loss_cls",
            "dn_loss_cls", "dn_loss_bbox", "d0.dn_loss_iou"} <= set(losses[1])
    for name in losses[0]:
        assert torch.equal(losses[0][name], losses[1][name]), name
    # 3 decoder layers and the encoder's proposals went through the new head.
    assert len(matched) == 4


def test_fast_host_config_swaps_only_the_head_and_the_optimizer_constructor():
    fast = Config.fromfile(str(CONFIGS / "dino_bf16_fast_host.py"))
    base = Config.fromfile(str(CONFIGS / "dino_bf16_fused_adamw.py")).to_dict()
    fast_dict = fast.to_dict()
    assert fast_dict["model"]["bbox_head"].pop("type") == "BatchedMatchingDINOHead"
    assert base["model"]["bbox_head"].pop("type") == "DINOHead"
    assert fast_dict["optim_wrapper"].pop("constructor") == "MergedGroupsOptimWrapperConstructor"
    assert "constructor" not in base["optim_wrapper"]
    assert fast_dict == base
    assert type(build_detector(fast.model).bbox_head) is BatchedMatchingDINOHead


def _cuda(inputs):
    scores, boxes, gts, metas = inputs
    return ([s.cuda() for s in scores], [b.cuda() for b in boxes],
            [InstanceData(bboxes=g.bboxes.cuda(), labels=g.labels.cuda()) for g in gts], metas)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["mixed", "ties"])
def test_targets_and_waits_on_cuda(case):
    # The CUDA path: pinned non-blocking index copies, one .cpu() of the
    # packed costs.  Same targets as mmdet's head; host waits
    # (cudaStreamSynchronize, as the CUDA runtime records them) 3 per call
    # against 5 or more per image.
    mmdet_head, head = build_heads("focal")
    inputs = _cuda(random_output(**CASES[case]))
    assert_same_targets(head.get_targets(*inputs), mmdet_head.get_targets(*inputs))
    waits = []
    for h in (head, mmdet_head):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            h.get_targets(*inputs)
        waits.append(sum(e.name == "cudaStreamSynchronize" for e in prof.events()))
    images = len(inputs[2])
    assert waits[0] <= 3 < 5 * images <= waits[1], waits


@pytest.mark.gpu
def test_dn_targets_and_waits_on_cuda():
    # No wait at all for the denoising targets (pinned non-blocking copies),
    # against mmdet's 2 a image (its factor's copy and the scalar written at
    # the positives).
    mmdet_head, head = build_heads("focal")
    inputs = _cuda(random_output(**CASES["mixed"]))
    gts, metas = inputs[2], inputs[3]
    meta = dn_meta(CASES["mixed"]["num_gts"], groups=5)
    assert_same_targets(head.get_dn_targets(gts, metas, meta),
                        mmdet_head.get_dn_targets(gts, metas, meta))
    waits = []
    for h in (head, mmdet_head):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            h.get_dn_targets(gts, metas, meta)
        waits.append(sum(e.name == "cudaStreamSynchronize" for e in prof.events()))
    assert waits[0] == 0 < len(gts) <= waits[1], waits


@pytest.mark.gpu
def test_losses_wait_less_on_cuda(monkeypatch):
    # From the same targets, mmdet's loss_by_feat_single waits (as the CUDA
    # runtime records it) at least 4 + B times more: each image's factor
    # copy, the normalisers' copies and their reads.
    mmdet_head, head = build_heads("focal")
    inputs = stacked(_cuda(random_output(**CASES["mixed"])))
    assert_same_losses(head.loss_by_feat_single(*inputs), mmdet_head.loss_by_feat_single(*inputs))
    targets = head.get_targets(list(inputs[0]), list(inputs[1]), *inputs[2:])
    waits = []
    for h in (head, mmdet_head):
        with_targets(h, "get_targets", targets, monkeypatch)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            h.loss_by_feat_single(*inputs)
        waits.append(sum(e.name == "cudaStreamSynchronize" for e in prof.events()))
    assert waits[1] - waits[0] >= 4 + len(inputs[2]), waits


def test_losses_under_a_process_group_are_mmdets(tmp_path, monkeypatch):
    # With a process group the normalisers are averaged over the processes,
    # as mmdet averages them: the same all-reduces, the same losses (one
    # process, gloo, here).
    import torch.distributed as dist

    mmdet_head, head = build_heads("focal")
    inputs = stacked(random_output(**CASES["mixed"]))
    reduced = []
    all_reduce = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce",
                        lambda tensor, *args, **kwargs: reduced.append(tensor.dtype)
                        or all_reduce(tensor, *args, **kwargs))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/group", rank=0, world_size=1)
    try:
        ours = head.loss_by_feat_single(*inputs)
        assert reduced == [torch.float32] * 2  # the class normaliser, the GT count
        assert_same_losses(ours, mmdet_head.loss_by_feat_single(*inputs))
        assert len(reduced) == 4
    finally:
        dist.destroy_process_group()


def build_device_matching_head(costs: str):
    """build_heads' pair, ours matching on the device."""
    mmdet_head, head = build_heads(costs)
    head.device_matching = True
    return mmdet_head, head


# Random costs have one optimum, which the device solver finds as scipy does:
# the targets are mmdet's bit for bit (ties: test_device_matching_ties).
# "more_gts_than_queries" falls back to the host matching.
@pytest.mark.parametrize("costs", sorted(MATCH_COSTS))
@pytest.mark.parametrize("case", sorted(set(CASES) - {"ties"}))
def test_device_matching_targets_are_mmdets(costs, case):
    mmdet_head, head = build_device_matching_head(costs)
    for seed in range(2):
        inputs = random_output(**CASES[case], seed=seed)
        assert_same_targets(head.get_targets(*inputs), mmdet_head.get_targets(*inputs))


def test_device_matching_ties_match_every_gt_once():
    """Tied costs: any optimum is right; each GT gets one query of its own."""
    _, head = build_device_matching_head("focal")
    scores, boxes, gts, metas = random_output(**CASES["ties"])
    labels, _, _, weights, num_pos, num_neg = head.get_targets(scores, boxes, gts, metas)
    assert num_pos == sum(len(gt) for gt in gts) and num_neg == 6 * len(gts) - num_pos
    for image_labels, image_weights, gt in zip(labels, weights, gts):
        matched = image_weights[:, 0] == 1
        assert int(matched.sum()) == len(gt)
        assert sorted(image_labels[matched].tolist()) == sorted(gt.labels.tolist())


@pytest.mark.parametrize("num_gts", [[3, 0, 2, 1], [5], [0, 0]])
def test_device_matching_does_not_wait(num_gts, monkeypatch):
    _, head = build_device_matching_head("focal")
    inputs = random_output(num_gts)
    assert count_host_waits(lambda: head.get_targets(*inputs), monkeypatch) == 0
