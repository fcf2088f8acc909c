"""The sync-free losses and overlaps give mmdet's values and gradients, bit
for bit (the same operations on the same numbers), without host reads of
their inputs (CPU, fp32 and fp64)."""
import pytest
import torch
from mmdet.models.losses import FocalLoss, GIoULoss, L1Loss
from mmdet.models.task_modules.assigners.match_cost import IoUCost
from mmdet.registry import MODELS
from mmdet.structures.bbox import bbox_overlaps as mmdet_bbox_overlaps

from msda_mm.models.dino.losses import (
    SyncFreeFocalLoss,
    SyncFreeGIoULoss,
    SyncFreeL1Loss,
    bbox_overlaps,
    sync_free_twin,
)
from msda_mm.models.dino.matching import iou_cost

from .host_waits import count_host_waits

DTYPES = [torch.float32, torch.float64]
NUM_CLASSES = 5
# DINO's parameters (its config), and others to show they are honoured.
BOX_LOSSES = {
    "l1": (dict(loss_weight=5.0), dict(loss_weight=0.5, reduction="sum")),
    "giou": (dict(loss_weight=2.0), dict(loss_weight=3.0, eps=1e-3, reduction="sum")),
}
MMDET_TYPES = {"l1": L1Loss, "giou": GIoULoss, "focal": FocalLoss}
OURS = {"l1": SyncFreeL1Loss, "giou": SyncFreeGIoULoss, "focal": SyncFreeFocalLoss}


def boxes(n, dtype, seed, pixels=1.0):
    """(n, 4) xyxy boxes with positive sizes, some of them degenerate (zero
    width: the clamped union and enclosing area)."""
    gen = torch.Generator().manual_seed(seed)
    corner = torch.rand(n, 2, generator=gen, dtype=dtype)
    size = torch.rand(n, 2, generator=gen, dtype=dtype) * 0.5
    size[::3, 0] = 0
    return torch.cat([corner, corner + size], 1) * pixels


def box_weights(kind, n, dtype):
    if kind is None:
        return None
    weight = torch.zeros(n, 4, dtype=dtype)
    if kind == "some":  # matched queries: weight 1 on all 4 coordinates
        weight[1::2] = 1
    return weight


def value_and_grad(fn, pred):
    pred = pred.detach().requires_grad_(True)
    loss = fn(pred)
    grad = torch.autograd.grad(loss.sum(), pred, allow_unused=True)[0] \
        if loss.requires_grad else None
    return loss.detach(), grad


def assert_same(ours, theirs):
    (x, gx), (y, gy) = ours, theirs
    assert x.dtype == y.dtype and x.shape == y.shape, (x, y)
    assert torch.equal(x, y) or (x.isnan().all() and y.isnan().all()), (x, y)
    # mmdet's empty overlaps are a new tensor without a graph: no gradient
    # where ours gives a zero one.
    if gy is None:
        assert gx is None or not gx.any()
    else:
        assert torch.equal(gx, gy)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(BOX_LOSSES))
@pytest.mark.parametrize("n", [6, 0])
@pytest.mark.parametrize("weight", [None, "some", "zero"])
@pytest.mark.parametrize("avg_factor", [None, 3.0])
@pytest.mark.parametrize("override", [None, "mean", "sum", "none"])
def test_box_losses_are_mmdets(name, dtype, n, weight, avg_factor, override):
    pred, target = boxes(n, dtype, 0, pixels=50), boxes(n, dtype, 1, pixels=50)
    w = box_weights(weight, n, dtype)
    for params in BOX_LOSSES[name]:
        ours, theirs = OURS[name](**params), MMDET_TYPES[name](**params)
        reduction = override or params.get("reduction", "mean")
        calls = [lambda p, loss=loss: loss(p, target, w, avg_factor=avg_factor,
                                           reduction_override=override)
                 for loss in (ours, theirs)]
        if avg_factor is not None and reduction == "sum":
            # mmdet's weight_reduce_loss refuses it where mmdet reaches it (not
            # after its early return); ours, whatever the weights.
            with pytest.raises(ValueError, match="avg_factor can not be used"):
                calls[0](pred)
            if w is None or w.any():
                with pytest.raises(ValueError, match="avg_factor can not be used"):
                    calls[1](pred)
            continue
        if w is not None and not w.any() and reduction == "none":
            # mmdet's early return gives the scalar 0 here; ours stays
            # elementwise (a shape that does not depend on the data): zeros.
            loss, grad = value_and_grad(calls[0], pred)
            assert not loss.any() and loss.shape[0] == n and (grad is None or not grad.any())
            assert value_and_grad(calls[1], pred)[0].shape == ()
            continue
        assert_same(value_and_grad(calls[0], pred), value_and_grad(calls[1], pred))


@pytest.mark.parametrize("dtype", DTYPES)
def test_giou_loss_takes_per_box_weights_as_mmdets(dtype):
    pred, target = boxes(6, dtype, 0), boxes(6, dtype, 1)
    for weight in (torch.rand(6, dtype=dtype), torch.zeros(6, dtype=dtype)):
        assert_same(*(value_and_grad(lambda p, loss=loss, w=weight: loss(p, target, w,
                                                                         avg_factor=2.0), pred)
                      for loss in (SyncFreeGIoULoss(), GIoULoss())))


def test_negative_weights_give_mmdets_early_return():
    # No positive weight: mmdet returns (pred * weight).sum(), not the loss.
    pred, target = boxes(4, torch.float64, 0), boxes(4, torch.float64, 1)
    weight = -torch.rand(4, 4, dtype=torch.float64)
    for ours, theirs in ((SyncFreeL1Loss(loss_weight=5.0), L1Loss(loss_weight=5.0)),
                         (SyncFreeGIoULoss(loss_weight=2.0), GIoULoss(loss_weight=2.0))):
        results = [value_and_grad(lambda p, loss=loss: loss(p, target, weight), pred)
                   for loss in (ours, theirs)]
        assert_same(*results)
        assert torch.equal(results[0][1], weight)


def labels_and_logits(n, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(NUM_CLASSES + 1, (n,), generator=gen)  # NUM_CLASSES: background
    return labels, torch.randn(n, NUM_CLASSES, generator=gen, dtype=dtype) * 3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [7, 0])
@pytest.mark.parametrize("weight", [None, "some", "zero"])
@pytest.mark.parametrize("avg_factor", [None, 3.0, "tensor"])
@pytest.mark.parametrize("override", [None, "mean", "sum", "none"])
@pytest.mark.parametrize("one_hot", [False, True])
def test_focal_loss_is_mmdets(dtype, n, weight, avg_factor, override, one_hot):
    labels, logits = labels_and_logits(n, dtype, 0)
    if one_hot:
        labels = torch.nn.functional.one_hot(labels, NUM_CLASSES + 1)[:, :NUM_CLASSES]
    w = None if weight is None else torch.rand(n, dtype=dtype) * (weight == "some")
    # DINO's normaliser under sync_cls_avg_factor: a (1,) tensor.
    factor = torch.tensor([3.0], dtype=dtype) if avg_factor == "tensor" else avg_factor
    params = dict(gamma=1.5, alpha=0.3, loss_weight=2.0)
    calls = [lambda p, loss=loss: loss(p, labels, w, avg_factor=factor,
                                       reduction_override=override)
             for loss in (SyncFreeFocalLoss(**params), FocalLoss(**params))]
    if factor is not None and override == "sum":
        for call in calls:
            with pytest.raises(ValueError, match="avg_factor can not be used"):
                call(logits)
        return
    assert_same(value_and_grad(calls[0], logits), value_and_grad(calls[1], logits))


def test_activated_focal_loss_is_mmdets():
    labels, logits = labels_and_logits(7, torch.float64, 0)
    probs = logits.sigmoid()
    assert_same(*(value_and_grad(lambda p, loss=loss: loss(p, labels, avg_factor=2.0), probs)
                  for loss in (SyncFreeFocalLoss(activated=True), FocalLoss(activated=True))))


# (is_aligned, leading dimensions, rows, cols); empty sets of boxes too.
OVERLAP_SHAPES = [(False, (), 6, 4), (False, (2,), 3, 5), (False, (), 0, 4), (False, (), 0, 0),
                  (True, (), 6, 6), (True, (2,), 4, 4), (True, (), 0, 0)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["iou", "iof", "giou"])
@pytest.mark.parametrize("aligned, batch, rows, cols", OVERLAP_SHAPES)
def test_overlaps_are_mmdets(dtype, mode, aligned, batch, rows, cols):
    num = torch.Size(batch).numel()
    a = boxes(rows * num, dtype, 0, pixels=20).view(*batch, rows, 4)
    b = boxes(cols * num, dtype, 1, pixels=20).view(*batch, cols, 4)
    if rows and cols:  # a zero-width box against itself: no union, no enclosing area
        b[..., 0, :] = a[..., 0, :]
    assert_same(*(value_and_grad(lambda p, f=f: f(p, b, mode, aligned, 1e-4), a)
                  for f in (bbox_overlaps, mmdet_bbox_overlaps)))


@pytest.mark.parametrize("mode", ["iou", "giou"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_iou_match_cost_is_mmdets(mode, dtype):
    # The head's IoU cost (every query against every GT, fp16 compared in
    # fp32) is IoUCost's, bit for bit, with no copy of its epsilon.
    from mmengine.structures import InstanceData

    cost = IoUCost(iou_mode=mode, weight=2.0)
    pred, gt = boxes(9, torch.float32, 0, pixels=80).to(dtype), boxes(4, torch.float32, 1, 80)
    ours = iou_cost(cost, pred, gt)
    theirs = cost(InstanceData(bboxes=pred), InstanceData(bboxes=gt))
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


@pytest.mark.parametrize("name", ["l1", "giou"])
@pytest.mark.parametrize("weight", ["some", "zero"])
def test_box_losses_do_not_read_the_device(name, weight, monkeypatch):
    # mmdet's `if not torch.any(weight > 0)` reads a scalar (a wait on CUDA);
    # GIoULoss's overlaps copy their epsilon too (new_tensor).
    pred, target = boxes(6, torch.float32, 0), boxes(6, torch.float32, 1)
    w = box_weights(weight, 6, torch.float32)
    waits = [count_host_waits(lambda loss=loss: loss(pred, target, w, avg_factor=2.0),
                              monkeypatch)
             for loss in (OURS[name](), MMDET_TYPES[name]())]
    assert waits == [0, 1 + (name == "giou" and weight == "some")]


def test_registered_and_twins_keep_the_parameters():
    for cls in OURS.values():
        assert MODELS.get(cls.__name__) is cls
    twin = sync_free_twin("loss_cls", FocalLoss(gamma=1.5, alpha=0.3, loss_weight=2.0,
                                                reduction="sum"), FocalLoss)
    assert type(twin) is SyncFreeFocalLoss
    assert (twin.gamma, twin.alpha, twin.loss_weight, twin.reduction) == (1.5, 0.3, 2.0, "sum")
    twin = sync_free_twin("loss_iou", GIoULoss(eps=1e-3, loss_weight=2.0), GIoULoss)
    assert type(twin) is SyncFreeGIoULoss and (twin.eps, twin.loss_weight) == (1e-3, 2.0)
    twin = sync_free_twin("loss_bbox", L1Loss(loss_weight=5.0, reduction="none"), L1Loss)
    assert type(twin) is SyncFreeL1Loss and (twin.loss_weight, twin.reduction) == (5.0, "none")
    ours = SyncFreeL1Loss()
    assert sync_free_twin("loss_bbox", ours, L1Loss) is ours
    with pytest.raises(ValueError, match="loss_bbox must be L1Loss or SyncFreeL1Loss to be "
                                         "compiled, got SmoothL1Loss"):
        sync_free_twin("loss_bbox", MODELS.build(dict(type="SmoothL1Loss")), L1Loss)


def test_bad_input_is_refused():
    pred = boxes(3, torch.float32, 0)
    with pytest.raises(ValueError, match="reduction_override must be one of .* got 'avg'"):
        SyncFreeL1Loss()(pred, pred, reduction_override="avg")
    with pytest.raises(ValueError, match="reduction must be one of .* got 'avg'"):
        SyncFreeGIoULoss(reduction="avg")
    with pytest.raises(ValueError, match=r"weight must be \(n,\) or pred's shape \(3, 4\), "
                                         r"got \(3, 2\)"):
        SyncFreeGIoULoss()(pred, pred, torch.ones(3, 2))
    with pytest.raises(ValueError, match="use_sigmoid must be True"):
        SyncFreeFocalLoss(use_sigmoid=False)
    with pytest.raises(ValueError, match="mode must be one of .* got 'diou'"):
        bbox_overlaps(pred, pred, mode="diou")
    with pytest.raises(ValueError,
                       match=r"bboxes2 must be \(..., n, 4\) boxes, got shape \(3, 5\)"):
        bbox_overlaps(pred, torch.zeros(3, 5))
    with pytest.raises(ValueError, match="same leading dimensions"):
        bbox_overlaps(pred[None], pred[None].expand(2, 3, 4))
    with pytest.raises(ValueError, match="bboxes1 has 3, bboxes2 2"):
        bbox_overlaps(pred, pred[:2], is_aligned=True)


@pytest.mark.parametrize("weight", [None, "some"])
@pytest.mark.parametrize("override", [None, "none", "sum"])
def test_losses_trace_into_one_graph(weight, override):
    # Dynamo alone (torch._dynamo.explain, no inductor: fast); mmdet's
    # `if not torch.any(weight > 0)` breaks the graph, ours do not.
    pred, target = boxes(6, torch.float32, 0), boxes(6, torch.float32, 1)
    w = box_weights(weight, 6, torch.float32)
    labels, logits = labels_and_logits(6, torch.float32, 0)
    factor = None if override == "sum" else 2.0

    def all_losses(losses, pred, target, w, labels, logits):
        l1, giou, focal = losses
        return (l1(pred, target, w, avg_factor=factor, reduction_override=override),
                giou(pred, target, w, avg_factor=factor, reduction_override=override),
                focal(logits, labels, None if w is None else w[:, 0], avg_factor=factor,
                      reduction_override=override),
                bbox_overlaps(pred, target, mode="giou"))

    args = (pred, target, w, labels, logits)
    ours = torch._dynamo.explain(all_losses)(
        (SyncFreeL1Loss(), SyncFreeGIoULoss(), SyncFreeFocalLoss()), *args)
    assert ours.graph_break_count == 0 and ours.graph_count == 1, ours.break_reasons
    if w is not None:
        theirs = torch._dynamo.explain(all_losses)(
            (L1Loss(), GIoULoss(), SyncFreeFocalLoss()), *args)
        assert theirs.graph_break_count > 0
