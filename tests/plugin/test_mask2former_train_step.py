"""A Mask2Former training step, instance and panoptic, with TritonMSDeformAttn
in the pixel decoder (mmdet's own configs, the attention swapped through
``panoptic_head.pixel_decoder.encoder.layer_cfg.self_attn_cfg.type``), on
CPU with the reference backend and on CUDA in bf16."""
import pytest
import torch
from mmdet.structures import DetDataSample
from mmdet.structures.mask import BitmapMasks
from mmengine.structures import InstanceData, PixelData

from msda_mm.models import TritonMSDeformAttn, triton_ms_deform_attn

from .detr_configs import build_detector, deformable_attentions, mask2former_model_cfg
from .train_step import finite_step

SIZE = 64  # the pixel decoder's three levels: 8 x 8, 4 x 4, 2 x 2


def small_mask2former(kind: str) -> torch.nn.Module:
    """mmdet's Mask2Former with 1 pixel-decoder layer, 3 decoder layers (one
    per feature level), 8 queries and 64 sampled mask points."""
    cfg = mask2former_model_cfg(kind, attn_type="TritonMSDeformAttn")
    cfg.panoptic_head.pixel_decoder.encoder.num_layers = 1
    cfg.panoptic_head.transformer_decoder.num_layers = 3
    cfg.panoptic_head.num_queries = 8
    cfg.train_cfg.num_points = 64
    cfg.data_preprocessor.batch_augments[0].size = (SIZE, SIZE)
    torch.manual_seed(0)
    model = build_detector(cfg)
    model.init_weights()
    return model.train()


def batch(kind: str) -> dict:
    """Two images with two rectangular things each (COCO labels 1 and 7);
    panoptic images also carry a semantic map of two stuff classes (80 + 3
    above, 80 + 10 below), as mmdet's panoptic loading gives it.  The data
    preprocessor moves it to the model's device."""
    samples = []
    for shift in (0, 5):
        masks = torch.zeros(2, SIZE, SIZE, dtype=torch.uint8)
        masks[0, 4 + shift:30, 6:40] = 1
        masks[1, 35:60, 20 + shift:50] = 1
        sample = DetDataSample(metainfo=dict(img_shape=(SIZE, SIZE), ori_shape=(SIZE, SIZE)))
        sample.gt_instances = InstanceData(
            bboxes=torch.tensor([[6.0, 4 + shift, 40, 30], [20 + shift, 35, 50, 60]]),
            labels=torch.tensor([1, 7]), masks=BitmapMasks(masks.numpy(), SIZE, SIZE))
        if kind == "panoptic":
            sem_seg = torch.full((1, SIZE, SIZE), 80 + 3)
            sem_seg[:, SIZE // 2:] = 80 + 10
            sample.gt_sem_seg = PixelData(sem_seg=sem_seg)
        samples.append(sample)
    images = [torch.randint(0, 256, (3, SIZE, SIZE), dtype=torch.uint8,
                            generator=torch.Generator().manual_seed(i)) for i in range(2)]
    return dict(inputs=images, data_samples=samples)


@pytest.mark.parametrize("kind", ["instance", "panoptic"])
def test_mask2former_loss_backward_is_finite(reference_backend, quiet_mmengine, monkeypatch,
                                             kind):
    """Guards: the pixel decoder's attention swap reaching msda_mm's op, and
    a Mask2Former step needing no compiled mmcv op on mmcv-lite (its point
    sampling is mmcv's grid_sample-based point_sample, pure PyTorch)."""
    model = small_mask2former(kind)
    op_calls = []
    op = triton_ms_deform_attn.multi_scale_deformable_attention
    monkeypatch.setattr(triton_ms_deform_attn, "multi_scale_deformable_attention",
                        lambda *args, **kwargs: op_calls.append(1) or op(*args, **kwargs))

    losses = finite_step(model, batch(kind))

    attentions = deformable_attentions(model)
    assert len(attentions) == len(op_calls) == 1
    assert type(attentions[0]) is TritonMSDeformAttn
    assert {"loss_cls", "loss_mask", "loss_dice", "d0.loss_mask"} <= set(losses)
    for name, p in attentions[0].named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    # Offsets (zero-initialised weight) learn through the sampling locations.
    assert attentions[0].sampling_offsets.weight.grad.abs().sum() > 0


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["instance", "panoptic"])
def test_mask2former_bf16_autocast_step_on_cuda(quiet_mmengine, kind):
    # configs/mask2former_r50_bf16.py's path: Triton kernels on a bf16 value.
    model = small_mask2former(kind).cuda()
    finite_step(model, batch(kind), autocast="cuda")
    for attn in deformable_attentions(model):
        assert torch.isfinite(attn.sampling_offsets.weight.grad).all()
