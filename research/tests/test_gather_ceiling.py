"""research.gather / scatter: the gather-only and atomics-only kernels
behind research/gather_ceiling.py sum exactly the corner rows an MSDA forward
reads and add into exactly the rows its backward adds into (CPU: Triton
interpreter)."""
import pytest
import torch

from bench.op.inputs import make_inputs
from bench.op.presets import PRESETS
from msda_mm.ops import msda_reference
from research.gather import corner_rows, distinct_rows, gather_sum
from research.scatter import scatter_add
from research.tests.tools import assert_needs_a_gpu, assert_usage_error, load


def test_rows_are_the_bilinear_corners():
    # With every attention weight 1 and value rows of one-hot "row ids", the
    # reference's output spreads each sample's bilinear weights over exactly
    # the rows corner_rows names (inside the level; clamping only adds rows
    # of weight 0 at the edges).
    inputs = make_inputs(PRESETS["tiny"], "uniform", seed=3)
    B, S, M, _ = inputs.value.shape
    rows = corner_rows(inputs)  # (B*Q*M, L*K*4)
    ids = torch.eye(B * S * M, dtype=torch.float64).view(B, S, M, B * S * M)
    ones = torch.ones_like(inputs.attention_weights, dtype=torch.float64)
    weights = msda_reference(ids, inputs.spatial_shapes, inputs.sampling_locations.double(),
                             ones, inputs.level_start_index)
    weights = weights.view(-1, M, B * S * M).flatten(0, 1)  # (B*Q*M, rows)
    touched = weights.abs() > 1e-9
    named = torch.zeros_like(touched)
    named.scatter_(1, rows.long(), True)
    assert (touched & ~named).sum() == 0  # every row the op reads is named
    assert rows.dtype == torch.int32
    assert rows.shape[1] == inputs.sampling_locations[0, 0, 0].numel() * 2


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("n_rows", [5, 64, 200])
def test_distinct_rows_names_each_row_once(shuffle, n_rows):
    rows = torch.randint(0, n_rows, (30, 16), generator=torch.Generator().manual_seed(1),
                         dtype=torch.int32)
    want = rows.unique()
    once = distinct_rows(rows, 8, shuffle)
    flat = once.view(-1)
    assert once.dtype == torch.int32 and once.shape[1] == 8
    assert once.numel() == -(-want.numel() // 8) * 8  # padded to whole lines only
    assert torch.equal(flat[:want.numel()].sort().values, want)  # each distinct row once
    assert torch.equal(flat[want.numel():], flat[:once.numel() - want.numel()])  # the padding
    assert torch.equal(flat[:want.numel()], want) != shuffle
    assert torch.equal(distinct_rows(rows, 8, shuffle), once)  # seeded


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tile", [(2, 16, 1), (4, 8, 2)])
def test_gather_sum_matches_index_select(dtype, tile):
    g = torch.Generator().manual_seed(0)
    value = torch.randn(50, 32, generator=g).to(dtype)
    rows = torch.randint(0, 50, (7, 32), generator=g, dtype=torch.int32)
    out = gather_sum(value, rows, *tile)
    want = value.float()[rows.long()].sum(1)
    torch.testing.assert_close(out.float(), want, rtol=2**-7 if dtype != torch.float32 else 1e-5,
                               atol=1e-2 if dtype != torch.float32 else 1e-5)


# The interpreter has no bf16 atomics; fp16 is the 16-bit case here.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("tile", [(1, 16, 1), (4, 8, 2)])
def test_scatter_add_matches_index_add(dtype, tile):
    g = torch.Generator().manual_seed(0)
    grad = torch.randn(50, 32, generator=g).to(dtype)
    rows = torch.randint(0, 50, (7, 32), generator=g, dtype=torch.int32)  # repeats: collisions
    src = torch.randn(7, 32, generator=g).to(dtype)
    want = grad.double().index_add(0, rows.long().flatten(), src.double().repeat_interleave(32, 0))
    out = scatter_add(grad, rows, src, *tile)
    assert out is grad
    # fp16: each add rounds; a row gets ~4.5 adds of O(1) values (2**-10 relative each).
    torch.testing.assert_close(out.double(), want, rtol=1e-5 if dtype == torch.float32 else 4e-3,
                               atol=1e-5 if dtype == torch.float32 else 2e-2)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="D=24 must be a power of two"):
        gather_sum(torch.zeros(4, 24), torch.zeros(2, 16, dtype=torch.int32))
    with pytest.raises(ValueError, match="D=24 must be a power of two"):
        scatter_add(torch.zeros(4, 24), torch.zeros(2, 16, dtype=torch.int32), torch.zeros(2, 24))
    with pytest.raises(ValueError, match=r"src \(3, 32\) must be \(N, D\) = \(2, 32\)"):
        scatter_add(torch.zeros(4, 32), torch.zeros(2, 16, dtype=torch.int32), torch.zeros(3, 32))


@pytest.mark.parametrize("args, message", [
    (["--tiles", "2x16"], "expected BLOCK_QxBLOCK_RxWARPS"),
    (["--presets", "yolo"], "'yolo': choose from tiny, decoder"),
])
def test_bad_command_lines_say_what_is_wrong(args, message, capsys):
    assert_usage_error("gather_ceiling.py", args, message, capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")
def test_without_cuda_the_tool_says_it_needs_a_gpu():
    assert_needs_a_gpu("gather_ceiling.py")


@pytest.mark.gpu
def test_tool_times_the_forward_backward_gathers_and_atomics(tmp_path):
    assert load("gather_ceiling.py")["main"](
        ["--presets", "decoder", "--dtypes", "bf16", "--tiles", "2x16x1", "--scatter-tiles",
         "1x64x1", "--budget-ms", "20", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*-gather-ceiling.json")
    import json
    cells = json.loads(path.read_text())["cells"]
    assert [c["kernel"] for c in cells] == [
        "msda_mm forward", "gather 2x16x1", "distinct rows once, shuffled",
        "distinct rows once, sorted", "msda_mm backward", "zero fill", "torch.zeros",
        "scatter 1x64x1", "fill + scatter 1x64x1"]
    assert all(c["graph_us"] > 0 and c["gbps_kernel"] > 0 for c in cells)
    # Each distinct row once: fewer bytes than the forward's gathers, the same in both orders.
    assert cells[2]["moved_mb"] == cells[3]["moved_mb"] < cells[0]["moved_mb"]
    # The fill moves grad_value (bf16, native atomics on the H200), not the rows.
    # Its element size is the accumulation's (bf16 natively; fp32 where the
    # op picks fp32 scratch, below sm_90).
    from msda_mm.ops import bf16_atomics_are_slow
    p, accum_bytes = PRESETS["decoder"], 4 if bf16_atomics_are_slow(torch.device("cuda")) else 2
    assert cells[5]["moved_mb"] == pytest.approx(p.batch * p.num_values * p.heads * p.head_dim
                                                 * accum_bytes / 1e6)
