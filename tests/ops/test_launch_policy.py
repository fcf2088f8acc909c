"""The launcher's choice of kernel and tile for a call's shapes and dtypes."""
import torch

from msda_mm.ops import launch


def test_forward_takes_one_query_per_program_only_on_small_grids():
    value = torch.empty(2, 100, 8, 32, dtype=torch.bfloat16, device="meta")
    assert launch._tile("fwd", value, 16, rows=4 * 300 * 8)["BLOCK_Q"] == 1
    assert launch._tile("fwd", value, 16, rows=2 * 22223 * 8)["BLOCK_Q"] == 2
    assert launch._tile("bwd", value, 16, rows=4 * 300 * 8)["BLOCK_Q"] == 1


def test_pairs_kernel_only_where_it_applies():
    def tile(rows=1 << 20, dtype=torch.bfloat16, shape=(2, 100, 8, 32), acc=launch.tl.float32,
             value=None):
        value = torch.empty(shape, dtype=dtype) if value is None else value
        return launch._pairs_tile(value, rows, acc)

    assert tile() == dict(BLOCK_Q=8, BLOCK_D=32, num_warps=1)
    assert tile(dtype=torch.float16, shape=(2, 100, 4, 64))["BLOCK_Q"] == 4
    assert tile(rows=9600) is None  # a decoder: msda_fwd_kernel, latency-bound
    assert tile(dtype=torch.float32) is None
    assert tile(acc=launch.tl.float64) is None  # fp64 locations: fp64 accumulation
    assert tile(shape=(2, 100, 8, 31)) is None  # odd D
    assert tile(value=torch.empty(2, 100, 8, 33, dtype=torch.bfloat16)[..., :32]) is None
    assert tile(value=torch.empty(2, 100, 8, 32, dtype=torch.bfloat16).transpose(2, 3)) is None
    unaligned = torch.empty(2 * 100 * 8 * 32 + 1, dtype=torch.bfloat16)[1:]
    assert tile(value=unaligned.view(2, 100, 8, 32)) is None
    with launch.tile_override(pairs=(2, 1)):
        assert tile(rows=9600)["BLOCK_Q"] == 2
        with launch.tile_override(fwd=(1, 1, 16)):
            assert tile() is None
