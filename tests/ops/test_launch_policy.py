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


def test_grad_value_buffer_is_zeroed_as_words_where_it_can_be(monkeypatch):
    # 16-bit buffers of even size are zeroed through an int32 view (PyTorch's
    # 16-bit fill is slower per byte on the H200); odd sizes and other
    # dtypes through their own.  Either way every byte is 0, also where the
    # allocation held garbage (here: 0xff everywhere).
    seen = []
    empty, zero_ = torch.empty, torch.Tensor.zero_
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).view(-1).view(
        torch.uint8).fill_(255).view(k["dtype"]).view(a[0]))
    monkeypatch.setattr(torch.Tensor, "zero_", lambda t: seen.append(t.dtype) or zero_(t))
    for dtype, shape, via in [(torch.bfloat16, (2, 3, 4, 6), torch.int32),
                              (torch.float16, (1, 3, 1, 5), torch.float16),  # 15 elements
                              (torch.float32, (2, 3, 4, 6), torch.float32)]:
        seen.clear()
        out = launch.zeroed(shape, dtype, torch.device("cpu"))
        assert out.shape == shape and out.dtype == dtype and out.is_contiguous()
        assert seen == [via]
        assert not out.view(-1).view(torch.uint8).any()
