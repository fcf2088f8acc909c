"""A DINO training step with TritonMSDeformAttn on CPU (reference backend)."""
import pytest
import torch
from mmdet.testing import demo_mm_inputs

from msda_mm.models import triton_ms_deform_attn

from .detr_configs import build_detector, deformable_attentions, detr_model_cfg
from .train_step import finite_step


def small_dino_cfg():
    """DINO-4scale as configured by mmdet, with 2+2 layers and few queries."""
    cfg = detr_model_cfg("dino-4scale", attn_type="TritonMSDeformAttn")
    cfg.encoder.num_layers = 2
    cfg.decoder.num_layers = 2
    cfg.num_queries = 20
    cfg.dn_cfg.group_cfg.num_dn_queries = 10
    return cfg


def test_dino_loss_backward_is_finite(reference_backend, quiet_mmengine, monkeypatch):
    torch.manual_seed(0)
    model = build_detector(small_dino_cfg())
    model.init_weights()
    model.train()

    op_calls = []
    op = triton_ms_deform_attn.multi_scale_deformable_attention
    monkeypatch.setattr(triton_ms_deform_attn, "multi_scale_deformable_attention",
                        lambda *args, **kwargs: op_calls.append(1) or op(*args, **kwargs))

    batch = demo_mm_inputs(batch_size=1, image_shapes=[(3, 64, 64)], num_items=[3],
                           num_classes=80)
    losses = finite_step(model, batch)

    # Every encoder and decoder layer attended through msda_mm's op.
    assert len(op_calls) == len(deformable_attentions(model)) == 4
    assert {"loss_cls", "loss_bbox", "loss_iou", "dn_loss_cls", "enc_loss_cls"} <= set(losses)
    for attn in deformable_attentions(model):
        for name, p in attn.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
        # Offsets (zero-initialised weight) learn through the sampling locations.
        assert attn.sampling_offsets.weight.grad.abs().sum() > 0


@pytest.mark.gpu
def test_dino_bf16_autocast_step_on_cuda(quiet_mmengine):
    # The GPU path end to end: Triton kernels, bf16 value with fp32 locations,
    # and the heads' CUDA focal-loss branch without compiled mmcv.
    torch.manual_seed(0)
    model = build_detector(small_dino_cfg()).cuda()
    model.init_weights()
    model.train()
    batch = demo_mm_inputs(batch_size=2, image_shapes=[(3, 96, 64), (3, 64, 80)],
                           num_items=[3, 1], num_classes=80)
    finite_step(model, batch, autocast="cuda")
    for attn in deformable_attentions(model):
        assert torch.isfinite(attn.sampling_offsets.weight.grad).all()
