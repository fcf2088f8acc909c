"""mmcv's own CUDA kernels, built by msda_mm from the mmcv sdist, against
msda_mm's: the baseline of every benchmark and parity check must compute
what msda_mm's kernels compute.

Needs the build for this GPU: from MSDA_MM_MMCV_SDIST (the mmcv-2.1.0.tar.gz
to build from; an earlier build of it is reused) or an earlier
tools/build_mmcv_msda.py run.  Without either these tests fail, saying so.
"""
import json
import os
import runpy
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from msda_mm import multi_scale_deformable_attention
from msda_mm.compat import mmcv_cuda_build, mmcv_cuda_switch
from msda_mm.ops import level_start_index_from_shapes
from msda_mm.parity.attention import use_op

# isort: split
# After msda_mm, whose mmcv-lite shims make it importable.
from mmcv.ops import MultiScaleDeformableAttention, multi_scale_deform_attn

from msda_inputs import FLOAT_INPUTS, assert_close_to_reference, make_inputs, rel_err, run_op

pytestmark = pytest.mark.gpu

SDIST_ENV = "MSDA_MM_MMCV_SDIST"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kernels():
    sdist = os.environ.get(SDIST_ENV)
    if sdist:
        return mmcv_cuda_build.load_extension(mmcv_cuda_build.build(sdist).folder)
    if mmcv_cuda_build.found_build() is None:
        pytest.fail(f"no build of mmcv's MSDA kernels for this GPU, and {SDIST_ENV} is unset: "
                    f"set {SDIST_ENV}=path/to/mmcv-2.1.0.tar.gz or run "
                    f"python tools/build_mmcv_msda.py --sdist mmcv-2.1.0.tar.gz first")
    return mmcv_cuda_build.load_extension()


@pytest.fixture
def mmcv_op(kernels):
    """mmcv's Function on the built kernels, with the op's argument order
    (level_start_index made from the shapes when the inputs have None)."""
    def op(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
        if level_start_index is None:
            level_start_index = level_start_index_from_shapes(spatial_shapes)
        return mmcv_cuda_switch.mmcv_function(value, spatial_shapes, level_start_index,
                                              sampling_locations, attention_weights)

    with mmcv_cuda_switch.mmcv_cuda_msda(kernels):
        yield op


# D picks mmcv's backward kernel: 8 and 32 its block-size-aware v1, 48 the
# shared-memory v1, 64 the block-size-aware v2, 96 the shared-memory v2.
@pytest.mark.parametrize("D", [8, 32, 48, 64, 96])
@pytest.mark.parametrize("B", [1, 3])
def test_fp32_matches_the_fp64_truth_as_msda_mm_does(mmcv_op, D, B):
    # Both within fp32 rounding of the fp64 reference on the same inputs
    # (twice the fp32 reference's error, or 32 units): so within twice that
    # of each other.  Locations in [-0.5, 1.5]: some samples leave every level.
    args, seed = make_inputs(B=B, Q=33, M=2, D=D, shapes=((9, 7), (4, 5), (2, 3)), K=4)
    assert_close_to_reference(args, "cuda", seed, fn=mmcv_op)
    assert_close_to_reference(args, "cuda", seed)


def test_fp64_is_the_reference(mmcv_op):
    # mmcv's kernels dispatch float64 too: the same bilinear sampling, border
    # handling and gradients as msda_mm's fp64 kernels and reference.
    args, seed = make_inputs(B=2, Q=17, M=2, D=32, shapes=((6, 7), (3, 4)), K=3,
                             dtype=torch.float64)
    on_gpu = {k: (v.cuda() if v is not None else None) for k, v in args.items()}
    out, grads, grad_out = run_op(on_gpu, fn=mmcv_op)
    ours, our_grads, _ = run_op(on_gpu, grad_out=grad_out)
    assert rel_err(out, ours) < 1e-12, f"seed {seed}"
    for k in FLOAT_INPUTS:
        assert rel_err(grads[k], our_grads[k]) < 1e-12, (k, seed)


def test_fp16_value_with_fp32_locations_as_under_amp(mmcv_op):
    # mmcv casts locations and weights to fp16 and sums in fp16: 2**-11
    # rounding of each of L * K * 4 = 32 terms, 1e-2 relative with room.
    args, seed = make_inputs(B=2, Q=9, M=2, D=32, dtype=torch.float16,
                             loc_dtype=torch.float32, attn_dtype=torch.float32, lo=0.0, hi=1.0)
    on_gpu = {k: (v.cuda() if v is not None else None) for k, v in args.items()}
    out, grads, _ = run_op(on_gpu, fn=mmcv_op)
    truth = {k: (v.double() if k in FLOAT_INPUTS else v) for k, v in on_gpu.items()}
    want, _, _ = run_op(truth)
    assert out.dtype == grads["value"].dtype == torch.float16
    assert grads["sampling_locations"].dtype == grads["attention_weights"].dtype == torch.float32
    assert rel_err(out, want) < 1e-2, f"seed {seed}"
    assert all(torch.isfinite(g).all() for g in grads.values())


def test_bf16_is_refused_by_mmcvs_dispatch(mmcv_op):
    args, _ = make_inputs(dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match="BFloat16"):
        mmcv_op(*args.values())


def _attention_inputs(embed_dims=64, levels=((12, 10), (6, 5)), B=2, Q=20):
    g = torch.Generator().manual_seed(0)
    shapes = torch.tensor(levels)
    S = int(shapes.prod(1).sum())
    return dict(query=torch.randn(B, Q, embed_dims, generator=g).cuda(),
                value=torch.randn(B, S, embed_dims, generator=g).cuda(),
                reference_points=torch.rand(B, Q, len(levels), 2, generator=g).cuda(),
                spatial_shapes=shapes.cuda(),
                level_start_index=level_start_index_from_shapes(shapes).cuda())


def _counting(kernels) -> tuple[types.ModuleType, list]:
    """The built kernels in a module that records each call's name: which ran."""
    calls, module = [], types.ModuleType("counting")
    def counting(name):
        fn = getattr(kernels, name)

        def counted(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)
        return counted

    for name in mmcv_cuda_build.OPS:
        setattr(module, name, counting(name))
    return module, calls


def test_the_switch_routes_mmcvs_module_to_the_build(kernels):
    model = torch.nn.Module()
    model.attn = MultiScaleDeformableAttention(embed_dims=64, num_heads=2, num_levels=2,
                                               num_points=4, batch_first=True,
                                               dropout=0.0).cuda()
    model.attn.init_weights()
    inputs = _attention_inputs()
    module, calls = _counting(kernels)
    with mmcv_cuda_switch.mmcv_cuda_msda(module):
        out = model.attn(**inputs)
        out.sum().backward()
    assert calls == list(mmcv_cuda_build.OPS)
    grad = model.attn.value_proj.weight.grad.clone()
    model.zero_grad()
    with use_op(model, "triton"):
        ours = model.attn(**inputs)
        ours.sum().backward()
    assert rel_err(out, ours) < 1e-5 and rel_err(grad, model.attn.value_proj.weight.grad) < 1e-4
    # Outside the block mmcv-lite's route to msda_mm's op is back.
    assert multi_scale_deform_attn.MultiScaleDeformableAttnFunction.apply is \
        multi_scale_deformable_attention


def test_the_environment_variable_switches_on_import(kernels):
    code = ("import msda_mm; from msda_mm.compat import mmcv_cuda_switch, mmcv_cuda_build; "
            "print(mmcv_cuda_build.describe(mmcv_cuda_switch.active()))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, MSDA_MM_MMCV_CUDA="1"), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == mmcv_cuda_build.describe(kernels)


def test_benchmark_rows_of_the_build(kernels, tmp_path, capsys):
    main = runpy.run_path(str(ROOT / "tools" / "benchmark.py"))["main"]
    assert main(["--presets", "tiny", "--locations", "uniform", "--dtypes", "fp32,fp16,bf16",
                 "--impl", "msda_mm,mmcv_cuda", "--budget-ms", "2", "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "n/a   mmcv_cuda (1 cells): mmcv has no bf16 kernels" in table
    cells = json.loads(next(tmp_path.glob("*.json")).read_text())["cells"]
    mmcv = {c["dtype"]: c for c in cells if c["impl"] == "mmcv_cuda"}
    assert mmcv["fp32"]["status"] == mmcv["fp16"]["status"] == "ok", mmcv
    assert mmcv["fp32"]["max_err"] < 1e-5 and mmcv["fp32"]["fwd_us"] > 0
