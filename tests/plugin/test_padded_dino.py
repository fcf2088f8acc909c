"""SyncFreeDINO.padded_loss (static shapes: images on a canvas, GT boxes
padded to a cap) gives the losses SyncFreeDINO.loss gives on the same batch,
and the gradients of mmdet's DINO (CPU, fp32): padding changes no loss."""
import copy

import pytest
import torch
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config

from msda_mm.models.dino.padded_batch import bucket, pad_batch

from .detr_configs import build_detector
from .test_sync_free_dino import CONFIGS


def tiny_sync_free_dino(box_noise_scale: float = 1.0, label_noise_scale: float = 0.5,
                        compile_losses: bool = False):
    """The CPU demo's DINO as SyncFreeDINO with the batched-matching head
    (device matching), the every-query label noise and two denoising groups
    whatever the GT count (the padded queries' groups come from the cap)."""
    model = Config.fromfile(str(CONFIGS / "synthetic" / "dino_tiny_cpu.py")).model
    model.type = "SyncFreeDINO"
    model.label_noise_draws = "every_query"
    model.bbox_head.type = "BatchedMatchingDINOHead"
    model.bbox_head.device_matching = True
    model.bbox_head.compile_losses = compile_losses
    model.dn_cfg.update(label_noise_scale=label_noise_scale, box_noise_scale=box_noise_scale,
                        group_cfg=dict(dynamic=False, num_groups=2))
    torch.manual_seed(0)
    detector = build_detector(model)
    detector.init_weights()
    return detector.train()


def canvas_loss(model, data, canvas):
    """``model.loss`` on the batch as mmdet pads it, padded on to the
    canvas: the same images, masks and level sizes as a padded batch's."""
    inputs = model.data_preprocessor(copy.deepcopy(data), training=True)
    images, samples = inputs["inputs"], inputs["data_samples"]
    full = images.new_zeros((*images.shape[:2], *canvas))
    full[:, :, :images.shape[2], :images.shape[3]] = images
    for sample in samples:
        sample.set_metainfo(dict(batch_input_shape=tuple(canvas)))
    torch.manual_seed(1)
    return model.loss(full, samples)


def padded_loss(model, data, canvas, cap):
    """``model.padded_loss`` on the batch padded to canvas and cap."""
    inputs = model.data_preprocessor(copy.deepcopy(data), training=True)
    padded = pad_batch(inputs["inputs"], inputs["data_samples"], canvas, cap)
    torch.manual_seed(1)
    return model.padded_loss(padded)


def losses_both_ways(model, data, canvas, cap):
    """(loss on the batch as mmdet pads it, padded_loss on canvas/cap), each
    after the same seed."""
    return canvas_loss(model, data, canvas), padded_loss(model, data, canvas, cap)


def assert_close_losses(theirs, ours, rtol):
    assert set(theirs) == set(ours)
    assert {"loss_cls", "enc_loss_iou", "dn_loss_bbox", "d1.dn_loss_cls"} <= set(ours)
    for name in theirs:
        assert ours[name].shape == theirs[name].shape, name
        torch.testing.assert_close(ours[name], theirs[name], rtol=rtol, atol=1e-6, msg=name)


def test_full_caps_give_the_same_losses_and_draws(reference_backend, quiet_mmengine):
    """Every image with as many boxes as the cap, the canvas the batch's own
    size: the same queries (the same random draws in the same order) and
    the same losses, up to fp32 rounding."""
    model = tiny_sync_free_dino()
    data = demo_mm_inputs(batch_size=2, image_shapes=[(3, 64, 64), (3, 48, 64)],
                          num_items=[3, 3], num_classes=6)
    theirs, ours = losses_both_ways(model, data, (64, 64), 3)
    assert_close_losses(theirs, ours, rtol=1e-5)


@pytest.mark.parametrize("num_items", [[3, 1, 0], [5, 2, 2]])
def test_padding_changes_no_loss(num_items, reference_backend, quiet_mmengine):
    """Unequal GT counts (one image without a box) padded to a larger cap on
    a larger canvas: the losses of the batch padded only to the canvas.
    The noise is all but off, so that the draws (whose count the padding
    changes) do not matter."""
    model = tiny_sync_free_dino(box_noise_scale=1e-9, label_noise_scale=0.0)
    data = demo_mm_inputs(batch_size=3, image_shapes=[(3, 64, 64), (3, 48, 64), (3, 64, 40)],
                          num_items=num_items, num_classes=6)
    theirs, ours = losses_both_ways(model, data, (72, 80), max(num_items) + 4)
    assert_close_losses(theirs, ours, rtol=1e-5)


def test_compiled_losses_are_the_eager_ones(reference_backend, quiet_mmengine):
    """compile_losses=True (as the graphed configs take it): padded_loss's
    losses as compiled graphs give the eager ones, up to fp32 reordering."""
    data = demo_mm_inputs(batch_size=2, image_shapes=[(3, 64, 64), (3, 48, 64)],
                          num_items=[3, 1], num_classes=6)
    losses = []
    for compile_losses in (False, True):
        model = tiny_sync_free_dino(compile_losses=compile_losses)
        inputs = model.data_preprocessor(copy.deepcopy(data), training=True)
        torch.manual_seed(1)
        losses.append(model.padded_loss(
            pad_batch(inputs["inputs"], inputs["data_samples"], (64, 64), 5)))
    assert_close_losses(*losses, rtol=1e-5)


def test_bucket_takes_the_smallest_fitting_canvas_and_cap():
    canvases, caps = [(800, 1333), (1333, 800), (640, 640)], [10, 30, 100]
    assert bucket(canvases, caps, 600, 600, 0) == (640, 640, 10)
    assert bucket(canvases, caps, 900, 600, 11) == (1333, 800, 30)
    assert bucket(canvases, caps, 800, 1333, 100) == (800, 1333, 100)
    assert bucket(canvases, caps, 801, 1333, 5) is None
    assert bucket(canvases, caps, 600, 600, 101) is None


def test_pad_batch_refuses_what_does_not_fit(quiet_mmengine):
    data = demo_mm_inputs(batch_size=2, image_shapes=[(3, 32, 32)] * 2, num_items=[4, 1])
    images = torch.zeros(2, 3, 32, 32)
    samples = data["data_samples"]
    with pytest.raises(ValueError, match="gt_cap 3 is smaller than an image's 4"):
        pad_batch(images, samples, (32, 32), 3)
    with pytest.raises(ValueError, match=r"canvas \(32, 16\) is smaller than the batch"):
        pad_batch(images, samples, (32, 16), 4)
    with pytest.raises(ValueError, match="one data sample per image expected"):
        pad_batch(images, samples[:1], (32, 32), 4)


def test_padding_changes_no_gradient(reference_backend, quiet_mmengine):
    """mmdet's own DINO on the batch padded to the canvas, and padded_loss
    on the batch padded to canvas and cap, from the same weights: the same
    total loss and the same gradient of every parameter, up to fp32
    rounding (the noise all but off: the two draw it differently)."""
    # mmdet refuses no label noise at all: flips with probability 5e-10.
    ours = tiny_sync_free_dino(box_noise_scale=1e-9, label_noise_scale=1e-9)
    cfg = Config.fromfile(str(CONFIGS / "synthetic" / "dino_tiny_cpu.py")).model
    cfg.dn_cfg.update(label_noise_scale=1e-9, box_noise_scale=1e-9,
                      group_cfg=dict(dynamic=False, num_groups=2))
    theirs = build_detector(cfg).train()
    assert type(theirs).__name__ == "DINO"
    theirs.load_state_dict(ours.state_dict())
    data = demo_mm_inputs(batch_size=3, image_shapes=[(3, 64, 64), (3, 48, 64), (3, 64, 40)],
                          num_items=[3, 1, 0], num_classes=6)
    their_losses = canvas_loss(theirs, data, (72, 80))
    our_losses = padded_loss(ours, data, (72, 80), 7)
    grads = []
    for model, losses in ((theirs, their_losses), (ours, our_losses)):
        total, _ = model.parse_losses(losses)
        total.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
        grads[-1]["loss"] = total.detach()
    assert set(grads[0]) == set(grads[1]) and len(grads[0]) > 100
    # fp32 sums over other paddings, in other orders: about 1e-7 apart
    # where gradients reach 0.1.
    for name, expected in grads[0].items():
        torch.testing.assert_close(grads[1][name], expected, rtol=1e-4, atol=1e-6, msg=name)
