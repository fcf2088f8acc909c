"""msda_mm.bench.gather: the gather-only kernel behind tools/gather_ceiling.py
sums exactly the corner rows an MSDA forward reads (CPU: Triton interpreter)."""
import pytest
import torch

from msda_mm.bench.gather import corner_rows, gather_sum
from msda_mm.bench.inputs import make_inputs
from msda_mm.bench.presets import PRESETS
from msda_mm.ops import msda_reference


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
    assert rows.dtype == torch.int32 and rows.shape[1] == inputs.sampling_locations[0, 0, 0].numel() * 2


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


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="D=24 must be a power of two"):
        gather_sum(torch.zeros(4, 24), torch.zeros(2, 16, dtype=torch.int32))


def _tool():
    import runpy
    from pathlib import Path
    return runpy.run_path(str(Path(__file__).resolve().parents[1] / "tools/gather_ceiling.py"))


@pytest.mark.parametrize("args, message", [
    (["--tiles", "2x16"], "expected BLOCK_QxBLOCK_RxWARPS"),
    (["--presets", "yolo"], "'yolo': choose from tiny, decoder"),
])
def test_bad_command_lines_say_what_is_wrong(args, message, capsys):
    with pytest.raises(SystemExit):
        _tool()["parse_args"](args)
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")
def test_without_cuda_the_tool_says_it_needs_a_gpu():
    with pytest.raises(SystemExit, match="needs a GPU"):
        _tool()["main"]([])


@pytest.mark.gpu
def test_tool_times_the_forward_and_the_gathers(tmp_path):
    assert _tool()["main"](["--presets", "decoder", "--dtypes", "bf16", "--tiles", "2x16x1",
                            "--budget-ms", "20", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*-gather-ceiling.json")
    import json
    cells = json.loads(path.read_text())["cells"]
    assert [c["kernel"] for c in cells] == ["msda_mm forward", "gather 2x16x1"]
    assert all(c["graph_us"] > 0 and c["gbps_kernel"] > 0 for c in cells)
