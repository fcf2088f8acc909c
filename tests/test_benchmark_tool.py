"""tools/benchmark.py and bench.op on CPU: the input generators, the
targets check, a smoke run of the whole tool on the tiny preset, the
mmcv_cuda rows (mmcv's Function on a fake build of its kernels) and the
optional peer packages' rows (stand-in modules)."""
import csv
import json
import math
import re
import runpy
import sys
import types
from pathlib import Path

import pytest
import torch

from bench.op.inputs import CLUSTER_SIGMA_PX, make_inputs
from bench.op.peers import PEERS
from bench.op.presets import PRESETS, Preset, pyramid
from bench.op.report import console_table, write_json
from bench.op.targets import apply_targets, load_targets
from msda_mm.compat import MMCV_LITE
from msda_mm.ops import msda_reference

# isort: split
# After msda_mm, whose mmcv-lite shims make it importable.
from mmcv.ops import multi_scale_deform_attn
from mmcv_fakes import fake_build, pretend_gpu

TOOL = Path(__file__).resolve().parents[1] / "tools" / "benchmark.py"

# A decoder (random reference points) and an encoder (Q = S) with levels
# large enough for a few-pixel cluster to be told from uniform locations.
DECODER = Preset("t_dec", 2, ((40, 60), (20, 30)), queries=50, heads=3, head_dim=4, points=3)
ENCODER = Preset("t_enc", 2, ((12, 18), (6, 9)), heads=3, head_dim=4, points=3)


def test_coco_pyramid():
    levels = pyramid(800, 1333, (8, 16, 32, 64))
    assert levels == ((100, 167), (50, 84), (25, 42), (13, 21))
    assert PRESETS["encoder"].num_values == 22223 == PRESETS["encoder"].num_queries
    assert PRESETS["decoder"].num_queries == 300


@pytest.mark.parametrize("preset", [DECODER, ENCODER, PRESETS["tiny"]], ids=lambda p: p.name)
@pytest.mark.parametrize("dist", ["uniform", "clustered"])
def test_input_shapes_and_softmax(preset, dist):
    x = make_inputs(preset, dist)
    B, S, Q, M, D = (preset.batch, preset.num_values, preset.num_queries, preset.heads,
                     preset.head_dim)
    L, K = len(preset.levels), preset.points
    assert x.value.shape == (B, S, M, D)
    assert x.sampling_locations.shape == (B, Q, M, L, K, 2)
    assert x.attention_weights.shape == (B, Q, M, L, K)
    assert x.grad_output.shape == (B, Q, M * D)
    assert x.spatial_shapes.tolist() == [list(hw) for hw in preset.levels]
    assert x.level_start_index.tolist()[-1] == S - preset.levels[-1][0] * preset.levels[-1][1]
    sums = x.attention_weights.sum(dim=(-2, -1))
    torch.testing.assert_close(sums, torch.ones_like(sums))


def test_device_copy_keeps_locations_fp32():
    x = make_inputs(DECODER, "uniform").to("cpu", torch.bfloat16)
    assert x.value.dtype == x.grad_output.dtype == torch.bfloat16
    assert x.sampling_locations.dtype == x.attention_weights.dtype == torch.float32


def test_seed_determinism():
    a, b = make_inputs(DECODER, "clustered", seed=3), make_inputs(DECODER, "clustered", seed=3)
    c = make_inputs(DECODER, "clustered", seed=4)
    for name in ("value", "sampling_locations", "attention_weights", "grad_output"):
        assert torch.equal(getattr(a, name), getattr(b, name))
        assert not torch.equal(getattr(a, name), getattr(c, name))


def _pixel_offsets(preset, locations, centres):
    """Offsets (px of each level) of locations (B, Q, M, L, K, 2) from
    centres (B, Q, 2) normalised."""
    wh = torch.tensor([(w, h) for h, w in preset.levels], dtype=torch.float32)
    return (locations - centres[:, :, None, None, None, :]) * wh[:, None, :]


def test_encoder_clusters_around_own_pixel():
    # Query s of an encoder sits at value position s: row-major in its level.
    centres = []
    for h, w in ENCODER.levels:
        for i in range(h):
            centres += [((j + 0.5) / w, (i + 0.5) / h) for j in range(w)]
    centres = torch.tensor(centres).expand(ENCODER.batch, -1, -1)
    loc = make_inputs(ENCODER, "clustered").sampling_locations
    offsets = _pixel_offsets(ENCODER, loc, centres)
    assert offsets.abs().max() < 6 * CLUSTER_SIGMA_PX
    assert offsets.std().item() == pytest.approx(CLUSTER_SIGMA_PX, rel=0.1)
    uniform = _pixel_offsets(ENCODER, make_inputs(ENCODER, "uniform").sampling_locations, centres)
    assert uniform.abs().max() > 6 * CLUSTER_SIGMA_PX


def test_decoder_clusters_around_one_point_per_query():
    loc = make_inputs(DECODER, "clustered").sampling_locations
    centre = loc.mean(dim=(2, 3, 4))  # (B, Q, 2): estimate of each query's reference point
    assert _pixel_offsets(DECODER, loc, centre).abs().max() < 6 * CLUSTER_SIGMA_PX
    # Reference points themselves spread over the image.
    assert centre.std(dim=1).min() > 0.2


def test_targets():
    cells = [dict(preset="tiny", dist="uniform", dtype="fp32", impl="msda_mm", status="ok",
                  fwd_us=10.0, max_err=1e-7),
             dict(preset="tiny", dist="uniform", dtype="bf16", impl="msda_mm", status="ok",
                  fwd_us=30.0, max_err=math.nan),
             dict(preset="tiny", dist="uniform", dtype="bf16", impl="mmcv", status="n/a"),
             dict(preset="tiny", dist="uniform", dtype="fp32", impl="reference", status="ok",
                  fwd_us=1.0)]
    apply_targets(cells, load_targets('{"*/*/*/msda_mm": {"fwd_us": 20, "max_err": 0.01},'
                                      ' "*/*/*/mmcv": {"fwd_us": 1}}'))
    assert [c["target_ok"] for c in cells] == [True, False, None, None]
    assert "fwd_us" in cells[1]["target_note"] and "max_err" in cells[1]["target_note"]
    with pytest.raises(ValueError):
        load_targets('{"*": 3}')


def test_tool_smoke(tmp_path, capsys):
    main = runpy.run_path(str(TOOL))["main"]
    out = tmp_path / "bench"
    assert main(["--device", "cpu", "--presets", "tiny", "--dtypes", "fp32,bf16",
                 "--impl", "msda_mm,reference,mmcv", "--budget-ms", "1", "--out", str(out),
                 "--targets", '{"*/*/*/msda_mm": {"max_err": 0.02}}']) == 0
    table = capsys.readouterr().out
    assert "n/a   mmcv" in table

    result = json.loads((out / "cpu.json").read_text())
    assert {"device", "torch", "triton", "date", "command", "method"} <= result.keys()
    assert result["finished"] is True and result["cells_planned"] == 2 * 2 * 3
    cells = result["cells"]
    assert len(cells) == 2 * 2 * 3  # dists x dtypes x impls
    ran = [c for c in cells if c["impl"] != "mmcv"]
    assert all(c["status"] == "ok" for c in ran), [c["note"] for c in ran]
    assert all(c["status"] == "n/a" for c in cells if c["impl"] == "mmcv")
    for c in ran:
        assert c["fwd_us"] > 0 and c["fwdbwd_us"] > 0 and c["gather_gbps"] > 0
        # fp32: rounding of float32 sums; bf16: the output and grad_value round to bf16.
        assert c["max_err"] < (1e-5 if c["dtype"] == "fp32" else 2e-2), c
    assert all(c["target_ok"] for c in cells if c["impl"] == "msda_mm")

    with (out / "cpu.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(cells)
    assert {"preset", "dist", "dtype", "impl", "fwd_us", "bwd_us", "max_err"} <= rows[0].keys()
    assert (out / "cpu.png").read_bytes()[:4] == b"\x89PNG"


def test_a_run_stopped_early_keeps_the_cells_it_finished(tmp_path, monkeypatch):
    # Stopped (Ctrl-C here, a timeout's kill likewise) in its third cell.
    import bench.op.run as run
    cell, calls = run._cell, []

    def stop_at_third(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return cell(*args)
    monkeypatch.setattr(run, "_cell", stop_at_third)
    out = tmp_path / "bench"
    with pytest.raises(KeyboardInterrupt):
        runpy.run_path(str(TOOL))["main"](["--device", "cpu", "--presets", "tiny", "--dtypes",
                                           "fp32", "--impl", "msda_mm,reference",
                                           "--budget-ms", "1", "--out", str(out)])
    result = json.loads((out / "cpu.json").read_text())
    assert result["finished"] is False and result["cells_planned"] == 2 * 1 * 2
    assert [(c["dist"], c["impl"], c["status"]) for c in result["cells"]] == [
        ("uniform", "msda_mm", "ok"), ("uniform", "reference", "ok")]
    with (out / "cpu.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 2
    assert sorted(p.name for p in out.iterdir()) == ["cpu.csv", "cpu.json"]


def test_a_failed_write_leaves_the_last_whole_file(tmp_path):
    path = tmp_path / "cells.json"
    write_json(path, {"finished": False}, [{"impl": "msda_mm", "fwd_us": 1.0}])
    with pytest.raises(TypeError):
        write_json(path, {"finished": True}, [{"impl": "msda_mm", "fwd_us": object()}])
    assert json.loads(path.read_text()) == {"finished": False,
                                            "cells": [{"impl": "msda_mm", "fwd_us": 1.0}]}
    assert [p.name for p in tmp_path.iterdir()] == ["cells.json"]


def test_grad_loc_error_skips_samples_on_pixel_centre_lines():
    from bench.op.cell import _off_kinks
    x = make_inputs(PRESETS["tiny"], "uniform")  # level 0 is 3 x 2 (H x W)
    loc = torch.tensor([[0.75, 0.5], [0.25 + 1e-5, 0.4], [0.6, 0.5 / 3]])  # (x, y)
    x.sampling_locations = loc.view(1, 3, 1, 1, 1, 2)
    x.spatial_shapes = x.spatial_shapes[:1]
    # x * 2 - 0.5 = 1.0: on a column of centres; 1e-5 off it; y * 3 - 0.5 = 0.
    assert _off_kinks(x).flatten().tolist() == [False, False, False]
    x.sampling_locations = torch.tensor([0.6, 0.4]).view(1, 1, 1, 1, 1, 2)
    assert _off_kinks(x).flatten().tolist() == [True]


def test_tile_specs():
    from bench.op.impls import tiled
    assert tiled("msda_mm") == ("msda_mm", {})
    assert tiled("msda_mm@2x1,1x1x16") == ("msda_mm", dict(fwd=(2, 1), bwd=(1, 1, 16)))
    assert tiled("msda_mm@p8x1,1x1x16") == ("msda_mm", dict(pairs=(8, 1), bwd=(1, 1, 16)))
    for bad in ("msda_mm@p8x1x2,1x1", "msda_mm@2x1", "msda_mm@ax1,1x1"):
        with pytest.raises(ValueError, match="tile spec"):
            tiled(bad)


@pytest.fixture
def mmcv_cuda_impl(monkeypatch, tmp_path):
    """bench.op.impls with a pretended GPU and nothing built yet (the
    default build folder); its cached look-up of the build reset around."""
    from bench.op import impls
    impls.mmcv_cuda_kernels.cache_clear()
    yield impls, pretend_gpu(monkeypatch, tmp_path / "cache")
    impls.mmcv_cuda_kernels.cache_clear()


@pytest.mark.skipif(not MMCV_LITE, reason="mmcv_cuda is mmcv-lite's baseline")
def test_mmcv_cuda_rows_say_why_they_do_not_run(mmcv_cuda_impl):
    impls, _ = mmcv_cuda_impl
    cuda, fp32 = torch.device("cuda"), torch.float32
    assert impls.unavailable("mmcv_cuda", torch.device("cpu"), fp32) == "mmcv's op is CUDA only"
    assert impls.unavailable("mmcv_cuda", cuda, torch.bfloat16) == "mmcv has no bf16 kernels"
    assert "tools/build_mmcv_msda.py" in impls.unavailable("mmcv_cuda", cuda, fp32)
    table = console_table([dict(preset="tiny", dist="uniform", dtype="bf16", impl="mmcv_cuda",
                                status="n/a", note="mmcv has no bf16 kernels")])
    assert "n/a   mmcv_cuda (1 cells): mmcv has no bf16 kernels" in table


@pytest.mark.skipif(not MMCV_LITE, reason="mmcv_cuda is mmcv-lite's baseline")
def test_mmcv_cuda_runs_mmcvs_function_on_the_build(mmcv_cuda_impl):
    # The fake build computes with msda_mm's reference: mmcv's Function on CPU
    # tensors reaches it as it would reach the real kernels on CUDA ones.
    impls, folder = mmcv_cuda_impl
    fake_build(folder)
    assert impls.unavailable("mmcv_cuda", torch.device("cuda"), torch.float16) is None
    x = make_inputs(PRESETS["tiny"], "uniform").to("cpu", torch.float64)
    with impls.routed("mmcv_cuda"):
        out = impls.bind("mmcv_cuda", x)(x.value, x.sampling_locations, x.attention_weights)
    kernels = impls.mmcv_cuda_kernels()
    assert [c["dtypes"] for c in kernels.CALLS] == [(torch.float64,) * 3]  # cast to value's
    assert kernels.CALLS[0]["im2col_step"] == 64
    want = impls.bind("reference", x)(x.value, x.sampling_locations.double(),
                                      x.attention_weights.double())
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert multi_scale_deform_attn.ext_module is not kernels


def test_deterministic_rows_beside_the_default(tmp_path):
    # msda_mm_det is msda_mm with deterministic=True; --tiles gives both
    # families their extra rows.
    tool = runpy.run_path(str(TOOL))
    args = tool["parse_args"](["--device", "cpu", "--impl", "msda_mm,msda_mm_det",
                               "--tiles", "1x1,1x1x4"])
    assert args.impl == ("msda_mm", "msda_mm_det", "msda_mm@1x1,1x1x4", "msda_mm_det@1x1,1x1x4")
    assert tool["parse_args"](["--device", "cpu", "--impl", "reference", "--tiles",
                               "1x1,1x1x4"]).impl == ("reference", "msda_mm@1x1,1x1x4")
    out = tmp_path / "bench"
    assert tool["main"](["--device", "cpu", "--presets", "tiny", "--dtypes", "bf16",
                         "--locations", "clustered", "--impl", "msda_mm,msda_mm_det",
                         "--budget-ms", "1", "--out", str(out)]) == 0
    cells = {c["impl"]: c for c in json.loads((out / "cpu.json").read_text())["cells"]}
    assert cells.keys() == {"msda_mm", "msda_mm_det"}
    assert all(c["status"] == "ok" for c in cells.values()), cells
    # bf16: both sum grad_value exactly enough for one final rounding (the
    # interpreter's default is the fp32 scratch buffer).
    assert cells["msda_mm_det"]["err_rel_grad_value"] < 2 * 2.0**-8
    assert cells["msda_mm_det"]["fp32_grad_accum"] is None
    assert cells["msda_mm"]["fp32_grad_accum"] is True


# The optional peer packages, each test run for every one of them alike.
ALL_PEERS = pytest.mark.parametrize("peer", PEERS.values(), ids=lambda p: p.impl)


def _standin(peer, calls, with_function=True):
    """A stand-in for ``peer``'s package: its function with the call
    bench/op/peers.py makes (mmcv's order and layouts), computing with
    msda_mm's reference; each call's (shape, dtype) per argument goes to
    ``calls``."""
    module = types.ModuleType(peer.module)
    module.__version__ = "0.0.1"

    def msda(values, shapes, start_index, locs, attn, **options):
        calls.append([(tuple(t.shape), t.dtype) for t in (values, shapes, start_index, locs,
                                                          attn)])
        return msda_reference(values, shapes, locs, attn, start_index)

    if with_function:
        setattr(module, peer.function, msda)
    return module


@ALL_PEERS
def test_peer_rows_call_its_function_in_mmcv_layouts(monkeypatch, peer):
    from bench.op import impls
    calls = []
    monkeypatch.setitem(sys.modules, peer.module, _standin(peer, calls))
    assert impls.unavailable(peer.impl, torch.device("cuda"), torch.bfloat16) is None
    # float64 inputs: the stand-in computes what the reference computes, to the bit.
    x = make_inputs(PRESETS["tiny"], "uniform").to("cpu", torch.float64)
    args = (x.value, x.sampling_locations.double(), x.attention_weights.double())
    torch.testing.assert_close(impls.bind(peer.impl, x)(*args),
                               impls.bind("reference", x)(*args), rtol=0, atol=0)
    B, S, M, D, Q = x.value.shape + (x.sampling_locations.shape[1],)
    L, K = x.attention_weights.shape[3:]
    assert calls[0] == [((B, S, M, D), torch.float64), ((L, 2), torch.int64),
                        ((L,), torch.int64), ((B, Q, M, L, K, 2), torch.float64),
                        ((B, Q, M, L, K), torch.float64)]
    # A bf16 value: locations and weights (fp32 in the benchmark) go in its dtype.
    x = make_inputs(PRESETS["tiny"], "uniform").to("cpu", torch.bfloat16)
    out = impls.bind(peer.impl, x)(x.value, x.sampling_locations, x.attention_weights)
    assert [dtype for _, dtype in calls[1]] == [torch.bfloat16, torch.int64, torch.int64,
                                                torch.bfloat16, torch.bfloat16]
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize("peer", [p for p in PEERS.values() if not p.cuda_only],
                         ids=lambda p: p.impl)
def test_peer_rows_through_the_tool(monkeypatch, tmp_path, capsys, peer):
    calls = []
    monkeypatch.setitem(sys.modules, peer.module, _standin(peer, calls))
    out = tmp_path / "bench"
    assert runpy.run_path(str(TOOL))["main"](
        ["--device", "cpu", "--presets", "tiny", "--dtypes", "fp32", "--locations", "uniform",
         "--impl", f"reference,{peer.impl}", "--budget-ms", "1", "--out", str(out)]) == 0
    cells = {c["impl"]: c for c in json.loads((out / "cpu.json").read_text())["cells"]}
    assert cells[peer.impl]["status"] == "ok", cells[peer.impl]["note"]
    # fp32: the reference in fp32 against itself in fp64, rounding only.
    assert cells[peer.impl]["max_err"] < 1e-5
    assert calls and peer.impl in capsys.readouterr().out


@pytest.mark.parametrize("peer", [p for p in PEERS.values() if p.cuda_only],
                         ids=lambda p: p.impl)
def test_cuda_only_peer_rows_on_cpu_say_so(monkeypatch, tmp_path, capsys, peer):
    calls = []
    monkeypatch.setitem(sys.modules, peer.module, _standin(peer, calls))
    assert runpy.run_path(str(TOOL))["main"](
        ["--device", "cpu", "--presets", "tiny", "--dtypes", "fp32", "--locations", "uniform",
         "--impl", f"reference,{peer.impl}", "--budget-ms", "1", "--out", str(tmp_path)]) == 0
    assert f"n/a   {peer.impl} (1 cells): {peer.impl}'s op is CUDA only" in capsys.readouterr().out
    assert not calls


@ALL_PEERS
def test_without_a_peer_its_rows_say_how_to_install_it(monkeypatch, tmp_path, capsys, peer):
    monkeypatch.setitem(sys.modules, peer.module, None)  # import it: not found
    out = tmp_path / "bench"
    assert runpy.run_path(str(TOOL))["main"](
        ["--device", "cpu", "--presets", "tiny", "--dtypes", "fp32,bf16", "--locations",
         "uniform", "--impl", f"{peer.impl},reference", "--budget-ms", "1", "--out",
         str(out)]) == 0
    table = capsys.readouterr().out
    assert (f"n/a   {peer.impl} (2 cells): {peer.module.partition('.')[0]} is not "
            f"installed: {peer.install}") in table
    result = json.loads((out / "cpu.json").read_text())
    assert [c["status"] for c in result["cells"] if c["impl"] == "reference"] == ["ok", "ok"]
    assert f"{peer.module}.{peer.function} ({peer.install}" in result["method"][peer.impl]


@ALL_PEERS
def test_a_peer_without_the_function_names_the_expected_call(monkeypatch, peer):
    from bench.op import impls
    monkeypatch.setitem(sys.modules, peer.module, _standin(peer, [], with_function=False))
    x = make_inputs(PRESETS["tiny"], "uniform")
    with pytest.raises(AttributeError, match=re.escape(
            f"{peer.module} 0.0.1 has no {peer.function}: the benchmark calls "
            f"{peer.module}.{peer.function}(value (B, S, M, D), spatial_shapes")):
        impls.bind(peer.impl, x)


@pytest.mark.gpu
@ALL_PEERS
def test_peer_rows_on_cuda(tmp_path, peer):
    # The installed package, through the call bench/op/peers.py makes.
    pytest.importorskip(peer.module, reason=f"{peer.module} is not installed: {peer.install}")
    assert runpy.run_path(str(TOOL))["main"](
        ["--presets", "tiny", "--locations", "uniform", "--dtypes", "fp32,bf16", "--impl",
         peer.impl, "--budget-ms", "2", "--out", str(tmp_path)]) == 0
    cells = {c["dtype"]: c for c in json.loads(next(tmp_path.glob("*.json")).read_text())["cells"]}
    assert all(c["status"] == "ok" for c in cells.values()), cells
    assert cells["fp32"]["max_err"] < 1e-5  # fp32 rounding, as for mmcv's kernels
