"""msda_fwd_pairs_kernel, the forward of large fp16/bf16 grids (fp32 where a
tile asks for it), on the small shapes of the other accuracy tests: forced
with a tile_override, and checked to have run (its output and the
backward's gradients against fp64 truth)."""
import pytest
import torch

from msda_inputs import DEVICES, assert_close_to_reference, make_inputs

# Channel pairs: int32 words of fp16/bf16, int64 words of fp32.
PAIRED = [torch.float16, torch.bfloat16, torch.float32]


def _check(args, device, seed, launches):
    assert_close_to_reference(args, device, seed)
    assert launches, "the pairs kernel did not run"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", PAIRED, ids=str)
@pytest.mark.parametrize("D", [2, 6, 24, 32, 64])  # 6, 24: channel words past D masked
def test_head_dims(device, dtype, D, pairs_launches):
    args, seed = make_inputs(D=D, dtype=dtype, loc_dtype=torch.float32,
                             attn_dtype=torch.float32)
    _check(args, device, seed, pairs_launches)


# (5, 5): more levels than mmdet's 4, K != 4, and 25 points, so the 16-bit
# backward takes a full and a partial 16-point chunk.  Not (5, 8): the
# pairs kernel unrolls every point, and 40 points take 83-99 s a compile
# on the H200 box, over half of a 312 s GPU suite.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("L,K", [(1, 1), (4, 4), (5, 5)])
@pytest.mark.parametrize("Q", [1, 7])
def test_levels_points_and_partial_query_blocks(device, L, K, Q, pairs_launches):
    shapes = [(7, 5), (4, 3), (2, 2), (1, 3), (1, 1)][:L]
    args, seed = make_inputs(B=2, Q=Q, M=2, D=8, shapes=shapes, K=K, dtype=torch.bfloat16)
    _check(args, device, seed, pairs_launches)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("layout", ["heads_first", "channel_slice"])
def test_strided_value(device, layout, dtype, pairs_launches):
    args, seed = make_inputs(B=2, Q=6, M=2, D=8, dtype=dtype)
    value = args["value"]
    args["value"] = (value.transpose(1, 2).contiguous().transpose(1, 2) if layout == "heads_first"
                     else torch.cat([value, value], dim=-1)[..., :8])
    assert not args["value"].is_contiguous()
    _check(args, device, seed, pairs_launches)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shift", [0.5, 0.0], ids=["centres", "edges"])
def test_exact_grid_points(device, shift, pairs_launches):
    args, seed = make_inputs(B=1, Q=6, M=2, shapes=((4, 5), (2, 3)), K=2, dtype=torch.bfloat16,
                             loc_dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    loc = args["sampling_locations"]
    for lvl, (h, w) in enumerate([(4, 5), (2, 3)]):
        for c, n in ((0, w), (1, h)):
            loc[..., lvl, :, c] = (torch.randint(0, n + 1, loc[..., lvl, :, c].shape,
                                                 generator=g) + shift) / n
    _check(args, device, seed, pairs_launches)
