"""research/dead_queries.py: what counts as a dead query, and on a real
DINO that the invalid proposals, once their shared logit outranks every
valid position's, are the queries it counts (CPU)."""
import copy
from pathlib import Path

import pytest
import torch
from mmengine.config import Config

import msda_mm  # noqa: F401  (registrations, mmcv-lite shims)
from research.tests.tools import assert_usage_error, load

# isort: split
# After msda_mm, whose mmcv-lite shims make it importable.
from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_dead_fraction_counts_matching_queries_at_one_in_all_four_coordinates():
    dead_fraction = load("dead_queries.py")["dead_fraction"]
    boxes = torch.full((2, 3 + 4, 4), 0.5)
    boxes[:, 0] = 1.0  # a denoising query: not counted
    boxes[0, 3] = 1.0
    boxes[1, 5] = 1.0
    boxes[1, 6, :3] = 1.0  # three coordinates at 1: a valid box at the corner
    assert dead_fraction(boxes, 4) == 2 / 8
    assert dead_fraction(boxes, 7) == pytest.approx(4 / 14)


@pytest.mark.parametrize("shape, queries, message", [
    ((2, 7), 4, "reference_points must be"), ((2, 7, 2), 4, "reference_points must be"),
    ((2, 7, 4), 8, "num_queries must be in 1..7"), ((2, 7, 4), 0, "num_queries must be")])
def test_dead_fraction_refuses_what_is_no_set_of_boxes(shape, queries, message):
    with pytest.raises(ValueError, match=message):
        load("dead_queries.py")["dead_fraction"](torch.zeros(shape), queries)


def dead_fraction_at(sign: float) -> tuple:
    """The tiny CPU DINO's dead fraction on one training forward of a
    64 x 64 and a 32 x 64 image, its
    encoder's class logits of every position pushed towards their highest
    (sign 1) or lowest (-1) value where the memory is zero, i.e. at the
    invalid positions; and the share of the queries those positions must
    then take."""
    torch.manual_seed(0)
    model = MODELS.build(copy.deepcopy(
        Config.fromfile(str(CONFIGS / "synthetic" / "dino_tiny_cpu.py")).model))
    model.init_weights()
    direction = torch.randn(model.embed_dims)
    direction -= direction.mean()
    with torch.no_grad():
        # An invalid position's LayerNorm output (memory zero) lies on the
        # bias's direction, which gives the extreme logit; a valid one's
        # is turned away from it by its memory.
        model.memory_trans_fc.bias.copy_(10 * direction)
        cls = model.bbox_head.cls_branches[model.decoder.num_layers]
        cls.weight.copy_(sign * direction.expand_as(cls.weight))
    fractions, invalid = [], []
    load("dead_queries.py")["watch"](model, fractions)
    proposals = model.gen_encoder_output_proposals

    def counted(memory, mask, shapes):
        output_memory, output_proposals = proposals(memory, mask, shapes)
        invalid.append(torch.isinf(output_proposals).all(-1))
        return output_memory, output_proposals

    model.gen_encoder_output_proposals = counted
    batch = demo_mm_inputs(batch_size=2, image_shapes=[(3, 64, 64), (3, 32, 64)], num_items=[2, 3],
                           num_classes=6)
    model.train()
    data = model.data_preprocessor(batch, training=True)
    model.loss(data["inputs"], data["data_samples"])
    (mask,), queries = invalid, model.num_queries  # mask: (images, positions)
    per_image = mask.sum(-1)
    # Highest: the top-k takes the invalid positions first; lowest: only
    # where too few valid ones are left.
    forced = per_image if sign > 0 else queries - (mask.shape[-1] - per_image)
    return fractions, (forced.clamp(0, queries).float().mean() / queries).item()


def test_invalid_positions_that_outrank_the_valid_ones_are_the_dead_queries(reference_backend,
                                                                            quiet_mmengine):
    fractions, forced = dead_fraction_at(1.0)
    # The 32 x 64 image's padding (its feature maps' lower half) is invalid,
    # the 64 x 64 image has no invalid position.
    assert 0.3 < forced < 0.5
    assert fractions == [pytest.approx(forced)]
    fractions, forced = dead_fraction_at(-1.0)
    assert forced < 0.2
    assert fractions == [pytest.approx(forced)]


def test_bad_command_lines_are_refused(capsys):
    assert_usage_error("dead_queries.py", ["c.py"], "--seeds", capsys)
    assert_usage_error("dead_queries.py", ["c.py", "--seeds", "1", "--steps", "0"],
                       "is not an integer >= 1", capsys)
