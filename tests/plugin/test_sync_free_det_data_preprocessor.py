"""SyncFreeDetDataPreprocessor gives DetDataPreprocessor's data, its host
tensors moved in one packed copy (CPU: the packing and the rebuild; the CUDA
copy itself is the GPU test's); that copy is refused inside a CUDA graph's
capture."""
import copy

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.structures.bbox import HorizontalBoxes
from mmdet.testing import demo_mm_inputs
from mmengine.registry import DefaultScope
from mmengine.structures import BaseDataElement

from msda_mm.models import SyncFreeDetDataPreprocessor
from msda_mm.models.dino.data_preprocessor import plan_move
from msda_mm.models.dino.one_copy import pack, to_device, unpack

# DINO's preprocessing (mmdet's config), boxes kept as HorizontalBoxes.
CFG = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], bgr_to_rgb=True,
           pad_size_divisor=1, boxtype2tensor=False)


def preprocessors(**changes):
    with DefaultScope.overwrite_default_scope("mmdet"):
        return tuple(MODELS.build(dict(CFG, type=t, **changes))
                     for t in ("DetDataPreprocessor", "SyncFreeDetDataPreprocessor"))


def batch():
    return demo_mm_inputs(batch_size=3, image_shapes=[(3, 32, 40), (3, 24, 32), (3, 40, 24)],
                          num_items=[2, 0, 3], num_classes=5, use_box_type=True)


def leaves(data):
    """(path, value) of every tensor and box in ``data``, in a fixed order."""
    if isinstance(data, dict):
        return [(f"{k}.{p}", v) for k in sorted(data) for p, v in leaves(data[k])]
    if isinstance(data, (list, tuple)):
        return [(f"{i}.{p}", v) for i, x in enumerate(data) for p, v in leaves(x)]
    if isinstance(data, BaseDataElement):
        name = type(data).__name__
        # Sorted: the keys' order is the order they were set in, which no reader uses.
        return [(f"{name}.meta", repr(sorted(data.metainfo_items())))] + [
            (f"{name}.{p}", v) for p, v in leaves(dict(data.items()))]
    return [("", data)]


def assert_same_data(ours, theirs):
    ours, theirs = leaves(ours), leaves(theirs)
    assert [p for p, _ in ours] == [p for p, _ in theirs]
    for (path, a), (_, b) in zip(ours, theirs):
        assert type(a) is type(b), path
        if isinstance(a, HorizontalBoxes):
            a, b = a.tensor, b.tensor
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.device == b.device, path
            assert torch.equal(a, b), path
        else:
            assert a == b, path


def test_pack_and_unpack_give_back_every_tensor():
    tensors = [torch.arange(5, dtype=torch.uint8), torch.randn(3, 4), torch.zeros(0, 4),
               torch.tensor(True), torch.arange(6).view(2, 3).t(),
               torch.arange(3).expand(2, 3), torch.ones(1).expand(4)[:1],
               torch.randn(2, 3, dtype=torch.bfloat16), torch.randn(3, dtype=torch.float64)]
    buffer, layout = pack(tensors, pin=False)
    assert buffer.dtype == torch.uint8 and buffer.dim() == 1
    out = unpack(buffer, layout)
    for t, o in zip(tensors, out):
        assert o.dtype == t.dtype and o.shape == t.shape and o.is_contiguous()
        assert torch.equal(o, t)
        assert o.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()


def test_every_host_tensor_is_moved_and_rebuilt_as_cast_data_moves_it():
    # A target device other than the data's: the plan takes every CPU tensor
    # (images, GT and ignored boxes, labels) and rebuilds the structure from
    # the copies, as mmengine's cast_data does with its per-tensor copies.
    theirs, _ = preprocessors()
    data = batch()
    host = []
    build = plan_move(data, torch.device("meta"), host)
    buffer, layout = pack(host, pin=False)
    ours = build(iter(unpack(buffer, layout)))
    assert_same_data(ours, theirs.cast_data(copy.deepcopy(data)))
    moved = [v.tensor if isinstance(v, HorizontalBoxes) else v for _, v in leaves(ours)
             if isinstance(v, (torch.Tensor, HorizontalBoxes))]
    assert len(moved) == len(host) == 3 + 3 * 3  # images; GT boxes, labels, ignored boxes
    assert all(t.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
               for t in moved)


def test_pinned_images_are_copied_as_they_are(monkeypatch):
    # Images pinned by a DataLoader (pin_memory=True) are not packed: each is
    # copied without a wait by itself (pinning needs CUDA: is_pinned stood in).
    data = batch()
    images = data["inputs"]
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t: any(t is x for x in images))
    copies = []
    to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda t, *a, **k: copies.append(k) or to(t, *a, **k))
    host = []
    build = plan_move(data, torch.device("meta"), host)
    assert len(host) == 3 * 3 and not any(t is x for t in host for x in images)
    moved = build(iter(host))["inputs"]
    assert copies == [dict(non_blocking=True)] * 3
    assert all(m.device.type == "meta" and m.shape == x.shape for m, x in zip(moved, images))


def test_a_copy_inside_a_capture_is_refused(monkeypatch):
    # A captured copy would read its pinned buffer at every replay (capture
    # needs CUDA: the capture flag stood in).
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match=r"shapes \[\(2, 3\)\] copied to the device while a "
                                           r"CUDA graph is captured"):
        to_device([torch.zeros(2, 3)], torch.device("cuda"))


@pytest.mark.gpu
def test_a_copy_inside_a_real_capture_is_refused():
    if not torch.cuda.is_available():
        pytest.fail("GPU test run without CUDA")
    kept = to_device([torch.arange(4)], torch.device("cuda"))  # made before: allowed
    with pytest.raises(RuntimeError, match="while a CUDA graph is captured"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            kept[0].add_(1)
            to_device([torch.zeros(2, 3)], torch.device("cuda"))


@pytest.mark.parametrize("bgr_to_rgb", [True, False])
@pytest.mark.parametrize("training", [True, False])
def test_outputs_are_det_data_preprocessors(bgr_to_rgb, training):
    theirs, ours = preprocessors(bgr_to_rgb=bgr_to_rgb)
    assert type(ours) is SyncFreeDetDataPreprocessor
    data = batch()
    assert_same_data(ours(copy.deepcopy(data), training), theirs(copy.deepcopy(data), training))


def test_a_stacked_batch_swaps_channels_as_mmengine():
    theirs, ours = preprocessors(rgb_to_bgr=True, bgr_to_rgb=False)
    data = dict(inputs=torch.randint(0, 256, (2, 3, 16, 8), dtype=torch.uint8),
                data_samples=None)
    assert_same_data(ours(copy.deepcopy(data)), theirs(copy.deepcopy(data)))


def test_a_one_channel_image_is_refused_by_name():
    _, ours = preprocessors()
    data = dict(inputs=[torch.zeros(3, 8, 8, dtype=torch.uint8),
                        torch.zeros(1, 8, 8, dtype=torch.uint8)], data_samples=None)
    with pytest.raises(ValueError, match=r"inputs\[1\] has shape \(1, 8, 8\)"):
        ours(data)


@pytest.mark.gpu
@pytest.mark.parametrize("training", [True, False])
def test_cuda_outputs_are_mmdets_without_a_wait(training):
    theirs, ours = (p.cuda() for p in preprocessors(boxtype2tensor=True))
    data = batch()
    expected = theirs(copy.deepcopy(data), training)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = ours(copy.deepcopy(data), training)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_same_data(out, expected)
