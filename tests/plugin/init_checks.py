"""What Deformable DETR's initialisation leaves in a deformable attention."""
import math

import torch
from torch import nn


def expected_offset_bias(num_heads, num_levels, num_points):
    # Deformable DETR's init: head h looks along angle 2*pi*h/M, the direction
    # scaled to unit max-norm, point k at (k + 1) times it, on every level.
    bias = torch.empty(num_heads, num_levels, num_points, 2)
    for h in range(num_heads):
        theta = 2 * math.pi * h / num_heads
        direction = torch.tensor([math.cos(theta), math.sin(theta)])
        direction /= direction.abs().max()
        for k in range(num_points):
            bias[h, :, k] = direction * (k + 1)
    return bias.flatten()


def assert_deformable_detr_init(attn: nn.Module):
    assert torch.count_nonzero(attn.sampling_offsets.weight) == 0
    torch.testing.assert_close(
        attn.sampling_offsets.bias,
        expected_offset_bias(attn.num_heads, attn.num_levels, attn.num_points))
    assert torch.count_nonzero(attn.attention_weights.weight) == 0
    assert torch.count_nonzero(attn.attention_weights.bias) == 0
    for proj in (attn.value_proj, attn.output_proj):
        assert torch.count_nonzero(proj.bias) == 0
        bound = math.sqrt(6 / sum(proj.weight.shape))  # Xavier uniform
        assert proj.weight.abs().max() <= bound and proj.weight.std() > bound / 4
