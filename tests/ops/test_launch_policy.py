"""The launcher's choice of kernel and tile for a call's shapes and dtypes."""
import pytest
import torch
import triton.language as tl

from msda_mm.ops import runtime
from msda_mm.ops.backward import launcher as backward_launcher
from msda_mm.ops.backward import zero_fill
from msda_mm.ops.backward.launcher import launch_backward, plan_backward
from msda_mm.ops.tiles import TUNED, Tiles, current_tiles, tile_override


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64],
                         ids=str)
def test_forward_takes_one_query_per_program_only_on_small_16bit_grids(dtype):
    # fp32 decoders keep 2 queries a program (faster on the H200: docs/design.md).
    value = torch.empty(2, 100, 8, 32, dtype=dtype, device="meta")
    small = 1 if dtype != torch.float32 else 2
    assert TUNED.tile("fwd", value, 16, rows=4 * 300 * 8)["BLOCK_Q"] == small
    assert TUNED.tile("fwd", value, 16, rows=2 * 22223 * 8)["BLOCK_Q"] == 2
    assert TUNED.tile("bwd", value, 16, rows=4 * 300 * 8)["BLOCK_Q"] == 1


def test_pairs_kernel_only_where_it_applies():
    def tile(rows=1 << 20, dtype=torch.bfloat16, shape=(2, 100, 8, 32), acc=tl.float32,
             value=None):
        value = torch.empty(shape, dtype=dtype) if value is None else value
        return current_tiles().pairs_tile(value, rows, acc)

    assert tile() == dict(BLOCK_Q=8, BLOCK_D=32, num_warps=1)
    assert tile(dtype=torch.float16, shape=(2, 100, 4, 64))["BLOCK_Q"] == 4
    assert tile(rows=9600) is None  # a decoder: msda_fwd_kernel, latency-bound
    assert tile(dtype=torch.float32) == dict(BLOCK_Q=4, BLOCK_D=32, num_warps=1)
    assert tile(dtype=torch.float32, rows=9600) is None
    assert tile(acc=tl.float64) is None  # fp64 locations: fp64 accumulation
    assert tile(shape=(2, 100, 8, 31)) is None  # odd D
    assert tile(value=torch.empty(2, 100, 8, 33, dtype=torch.bfloat16)[..., :32]) is None
    assert tile(value=torch.empty(2, 100, 8, 32, dtype=torch.bfloat16).transpose(2, 3)) is None
    unaligned = torch.empty(2 * 100 * 8 * 32 + 1, dtype=torch.bfloat16)[1:]
    assert tile(value=unaligned.view(2, 100, 8, 32)) is None
    with tile_override(pairs=(2, 1)):
        assert tile(rows=9600)["BLOCK_Q"] == 2
        with tile_override(fwd=(1, 1, 16)):
            assert tile() is None


@pytest.mark.parametrize("dtype, numel, kernel", [
    # BLOCK = 4096 words, 2 programs in the interpreter:
    (torch.bfloat16, 2 * (5 * 4096 + 5), True),   # 6 blocks: 3 steps a program, a tail
    (torch.float16, 15, False),                   # an odd number of 16-bit elements
    (torch.float32, 4096, True),                  # one block exactly
    (torch.float64, 3, True),                     # 6 words
    (torch.bfloat16, 0, False),                   # nothing to fill, nothing launched
])
def test_fill_zeros_zeroes_every_byte(monkeypatch, dtype, numel, kernel):
    # Whole 4-byte words are zeroed by zero_fill_kernel (here in the
    # interpreter, two programs taking the grid-stride loop), the rest by
    # torch; either way every byte is 0, also where the buffer held garbage.
    launches = []
    real = zero_fill.zero_fill_kernel
    monkeypatch.setattr(zero_fill, "zero_fill_kernel", type("Spy", (), {
        "__getitem__": lambda self, grid: launches.append(grid) or real[grid]})())
    t = torch.empty(numel, dtype=dtype)
    t.view(torch.uint8).fill_(255)
    assert zero_fill.fill_zeros(t) is False  # no PDL without CUDA
    assert not t.view(torch.uint8).any()
    assert len(launches) == int(kernel)


@pytest.mark.parametrize("filled_with_pdl", [True, False])
def test_backward_uses_pdl_only_behind_a_fill_that_armed_it(monkeypatch, filled_with_pdl):
    # With PDL the backward starts before the kernel in front of it has
    # finished: safe only if that kernel is grad_value's fill (whose own
    # predecessors have finished), so the backward takes PDL exactly when
    # fill_zeros says it armed it.
    calls = []
    monkeypatch.setattr(backward_launcher, "fill_zeros",
                        lambda t: calls.append(("fill", t.shape)) or filled_with_pdl)
    monkeypatch.setattr(backward_launcher, "msda_bwd_kernel", type("Rec", (), {
        "__getitem__": lambda self, grid: lambda *a, **k: calls.append(
            ("bwd", k["PDL"], k["launch_pdl"]))})())
    B, S, Q, M, L, K, D = 1, 5, 2, 2, 1, 2, 8

    def meta(*shape):
        return torch.empty(shape, device="meta")

    launch_backward(meta(B, Q, M * D), meta(B, S, M, D), torch.tensor([[1, 5]]),
                    meta(B, Q, M, L, K, 2), meta(B, Q, M, L, K), False)
    assert calls == [("fill", (B, S, M, D)), ("bwd", filled_with_pdl, filled_with_pdl)]


def test_pdl_only_on_nvidia_sm90_outside_the_interpreter(monkeypatch):
    # griddepcontrol is sm_90+ PTX: not for sm_80, ROCm (which reports
    # "cuda" devices with capability 9.x) or the interpreter (no inline asm,
    # also with CUDA tensors under TRITON_INTERPRET=1).
    cuda = torch.device("cuda", 0)
    capability = {}
    monkeypatch.setattr(runtime, "device_facts", lambda index: (capability["cc"], 132))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    for cc, want in (((9, 0), True), ((10, 0), True), ((8, 0), False)):
        capability["cc"] = cc
        assert runtime.pdl_available(cuda) is want, cc
    assert not runtime.pdl_available(torch.device("cpu"))
    capability["cc"] = (9, 0)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not runtime.pdl_available(cuda)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert not runtime.pdl_available(cuda)


@pytest.mark.parametrize("Q, S, want, sort", [(300, 22223, (32, 1, 1), "counting"),
                                               (900, 22223, (32, 1, 1), "stable"),
                                               (900, 8500, (32, 1, 1), "stable"),
                                               (22223, 22223, (4, 1, 16), "stable"),
                                               (1000, 1000, (4, 1, 16), "stable")])
def test_gather_tile_and_sort_follow_the_entries_per_value_row(Q, S, want, sort):
    # Entries a row: 4 * Q * L*K / S with L*K = 16: 0.9 (decoder), 2.6
    # (dino_decoder), 6.8 (DINO's decoder on 640 x 512 images), 64 (encoder), 64.
    value = torch.empty(2, S, 8, 32, dtype=torch.bfloat16, device="meta")
    assert TUNED.deterministic_sort(value, Q * 16) == sort
    tile = TUNED.tile("gather", value, Q * 16, 2 * S * 8)
    assert (tile["BLOCK_Q"], tile["num_warps"], tile["BLOCK_P"]) == want
    fp32 = TUNED.tile("gather", value.float(), Q * 16, 2 * S * 8)
    assert (fp32["BLOCK_Q"], fp32["BLOCK_P"]) == (want[0], want[2])
    other = "stable" if sort == "counting" else "counting"
    with tile_override(gather=(4, 2, 4), sort=other) as tiles:
        assert tiles == current_tiles() == Tiles(gather=(4, 2, 4), sort=other)
        assert tiles.deterministic_sort(value, Q * 16) == other
        tile = tiles.tile("gather", value, Q * 16, 2 * S * 8)
        assert (tile["BLOCK_Q"], tile["num_warps"], tile["BLOCK_P"]) == (4, 2, 4)


def test_an_unknown_sort_is_refused():
    with pytest.raises(ValueError, match="sort must be one of .'stable', 'counting'., got 'radix'"):
        with tile_override(sort="radix"):
            pass


@pytest.mark.parametrize("dtype, block_p", [(torch.bfloat16, 16), (torch.float16, 16),
                                            (torch.float32, 8)], ids=str)
def test_deterministic_backward_takes_a_tile_of_its_own(dtype, block_p):
    # Without grad_value's atomics msda_bwd_kernel takes 4 queries a program on an encoder
    # (bf16 212.1 us against 289.9 at the float backward's fp32 tile), 1 query of 16 points
    # on a decoder; past D = 64 the float backward's fp32 tile, which does not spill at
    # D = 256.
    def tile(B, Q, D=32, M=8, deterministic=True, tiles=TUNED):
        value = torch.empty(B, 100, M, D, dtype=dtype, device="meta")
        loc = torch.empty(B, Q, M, 4, 4, 2, dtype=dtype, device="meta")
        attn = torch.empty(B, Q, M, 4, 4, dtype=dtype, device="meta")
        meta = plan_backward(value, loc, attn, False, deterministic, tiles=tiles).meta
        return meta["BLOCK_Q"], meta["num_warps"], meta["BLOCK_P"]

    assert tile(2, 22223) == (4, 1, block_p)
    assert tile(4, 900) == (1, 1, 16)
    assert tile(2, 22223, D=256) == (1, 4, 8)
    assert tile(2, 22223, D=64) == (2, 1, block_p)
    assert tile(2, 22223, deterministic=False) == (1, 1, 8 if dtype == torch.float32 else 16)
    other = Tiles(bwd=(2, 2, 4))
    assert tile(4, 900, tiles=other) == tile(2, 22223, tiles=other) == (2, 2, 4)


@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 5, 1, 2), (3, 0, 2), (0, 4), (7,), ()])
def test_contiguous_strides_are_pytorchs(shape):
    assert runtime.contiguous_strides(shape) == torch.empty(shape).stride()


class _Launched(Exception):
    """msda_bwd_kernel's launch, by parameter name, in place of running it."""

    def __init__(self, names, args):
        super().__init__()
        self.named = dict(zip(names, args))


@pytest.mark.parametrize("deterministic, softmax", [(False, False), (False, True),
                                                    (True, False)])
def test_backward_passes_the_strides_of_the_gradients_it_allocates(monkeypatch, deterministic,
                                                                   softmax):
    # The plan holds them (the gradients are contiguous whatever the inputs' layout):
    # each must be the allocated tensor's own.
    names = backward_launcher.msda_bwd_kernel.fn.arg_names

    def launch(*args, **kwargs):
        raise _Launched(names, args)
    monkeypatch.setattr(backward_launcher, "msda_bwd_kernel",
                        type("Stop", (), {"__getitem__": lambda self, grid: launch})())
    B, S, Q, M, L, K, D = 2, 5, 3, 2, 2, 2, 4
    loc = torch.rand(B, M, Q, L, K, 2).transpose(1, 2)
    attn = torch.rand(B, Q, L, K, M, dtype=torch.float64).permute(0, 1, 4, 2, 3)
    with pytest.raises(_Launched) as launched:
        launch_backward(torch.rand(B, Q, M * D), torch.rand(B, S, M, D),
                        torch.tensor([[1, 3], [1, 2]]), loc, attn, True, deterministic, softmax)
    args = launched.value.named
    gv = args["grad_value_ptr"]
    assert (gv is None) is deterministic
    assert tuple(args[f"stride_gv{d}"] for d in "bsm") == (
        (0, 0, 0) if deterministic else gv.stride()[:3])
    assert tuple(args[f"stride_gl{d}"] for d in "bqmlkc") == args["grad_loc_ptr"].stride() == (
        torch.empty(loc.shape).stride())
    assert tuple(args[f"stride_ga{d}"] for d in "bqmlk") == args["grad_attn_ptr"].stride() == (
        torch.empty(attn.shape).stride())
