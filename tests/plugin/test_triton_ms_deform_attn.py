"""TritonMSDeformAttn as a drop-in for mmcv's MultiScaleDeformableAttention."""
import os

import numpy as np
import pytest
import torch
from mmcv.ops import MultiScaleDeformableAttention
from mmdet.registry import MODELS
from torch import nn
from torch._dynamo.testing import CompileCounter

from msda_mm import TritonMSDeformAttn
from msda_mm.models import triton_ms_deform_attn

from .init_checks import assert_deformable_detr_init

HAS_CUDA = torch.cuda.is_available()
ARGS = dict(embed_dims=32, num_heads=4, num_levels=2, num_points=3, dropout=0.0, batch_first=True)
SHAPES = ((6, 4), (3, 2))  # (H, W) per level; S = 30


def attention_inputs(batch_first=True, ref_dim=2, dtype=torch.float32, B=2, Q=7,
                     device="cpu", seed=0):
    """Keyword arguments of a forward call on random data; shapes (B, Q, C)
    / (B, S, C), or (Q, B, C) / (S, B, C) unless batch_first."""
    g = torch.Generator().manual_seed(seed)
    C, S = ARGS["embed_dims"], sum(h * w for h, w in SHAPES)
    shapes = torch.tensor(SHAPES)
    mask = torch.zeros(B, S, dtype=torch.bool)
    mask[0, -3:] = True  # padding at the end of the first image's last level
    inputs = dict(
        query=torch.randn(B, Q, C, generator=g, dtype=dtype),
        value=torch.randn(B, S, C, generator=g, dtype=dtype),
        query_pos=torch.randn(B, Q, C, generator=g, dtype=dtype),
        key_padding_mask=mask,
        reference_points=torch.rand(B, Q, len(SHAPES), ref_dim, generator=g, dtype=dtype),
        spatial_shapes=shapes,
        level_start_index=torch.cumsum(shapes.prod(1), 0) - shapes.prod(1),
    )
    if not batch_first:
        for name in ("query", "value", "query_pos"):
            inputs[name] = inputs[name].transpose(0, 1)
    return {k: v.to(device) for k, v in inputs.items()}


def randomise(module: nn.Module, seed=1) -> nn.Module:
    # mmcv's init zeroes the offset weights and the attention logits, which
    # would hide wrong offset or weight handling behind a constant pattern.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return module


# Both sides sample with the same bilinear grid_sample; they differ only in the
# order the L*K weighted samples are summed (mmcv: one flattened sum; msda_mm:
# over L then K), a few ulp of O(10) outputs, i.e. ~1e-6 in fp32 and ~1e-14 in
# fp64.  The bounds leave 10x/100x headroom; a wrong offset, normaliser or mask
# moves outputs by O(0.1).
TOLERANCES = {torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("ref_dim", [2, 4], ids=["points", "boxes"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
def test_mmcv_state_dict_round_trip(reference_backend, dtype, ref_dim, batch_first):
    args = {**ARGS, "batch_first": batch_first}
    mmcv_attn = randomise(MultiScaleDeformableAttention(**args))
    state = mmcv_attn.to(dtype).state_dict()
    ours = TritonMSDeformAttn(**args).to(dtype)
    ours.load_state_dict(state, strict=True)
    assert list(ours.state_dict()) == list(state)

    inputs = attention_inputs(batch_first, ref_dim, dtype)
    # mmcv's forward runs its own PyTorch sampling for CPU tensors.
    expected = mmcv_attn(**inputs)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(ours(**inputs), expected, rtol=tol, atol=tol)


def _output_and_grads(module, inputs):
    """The module's output, then the gradients of out.square().sum() for its
    parameters (in order) and for query and value."""
    leaves = {k: inputs[k].detach().requires_grad_() for k in ("query", "value")}
    out = module(**{**inputs, **leaves})
    params = list(module.parameters())
    return [out, *torch.autograd.grad(out.square().sum(), params + list(leaves.values()))]


@pytest.mark.parametrize("backend", ["reference", "kernels"])
def test_outputs_and_gradients_match_mmcv_both_ways(monkeypatch, backend):
    # mmcv's module takes the attention softmax itself before its PyTorch
    # sampling; ours hands the logits to the op (kernels: the softmax in the
    # forward and backward kernels, in the interpreter on CPU).  fp64: both compute the
    # same function, so everything agrees to rounding (seen: 2e-15 on values
    # up to 11; a logits gradient that skips the softmax backward is off by 200).
    if backend == "reference":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert backend == "reference" or HAS_CUDA or os.environ.get("TRITON_INTERPRET") == "1"
    mmcv_attn = randomise(MultiScaleDeformableAttention(**ARGS)).double()
    ours = TritonMSDeformAttn(**ARGS).double()
    ours.load_state_dict(mmcv_attn.state_dict(), strict=True)
    back = MultiScaleDeformableAttention(**ARGS).double()
    back.load_state_dict(ours.state_dict(), strict=True)
    for (name, a), (_, b) in zip(back.state_dict().items(), mmcv_attn.state_dict().items(),
                                 strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)

    inputs = attention_inputs(B=1, Q=3, dtype=torch.float64)
    for got, want in zip(_output_and_grads(ours, inputs), _output_and_grads(mmcv_attn, inputs),
                         strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_init_weights_matches_mmcv():
    ours = randomise(TritonMSDeformAttn(**ARGS))
    ours.init_weights()
    assert_deformable_detr_init(ours)
    # Same random stream as mmcv's class: a seed gives the same weights.
    torch.manual_seed(3)
    ours = TritonMSDeformAttn(**ARGS)
    torch.manual_seed(3)
    mmcv_attn = MultiScaleDeformableAttention(**ARGS)
    for (name, a), (_, b) in zip(ours.state_dict().items(), mmcv_attn.state_dict().items(),
                                          strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_identity_residual_and_dropout_contract(reference_backend):
    attn = randomise(TritonMSDeformAttn(**{**ARGS, "dropout": 0.5})).eval()
    inputs = attention_inputs()
    identity = torch.randn_like(inputs["query"])
    plain = attn(**inputs)
    # Default identity is the query before query_pos is added.
    torch.testing.assert_close(attn(**inputs, identity=identity) - identity,
                               plain - inputs["query"])
    # mmcv's deprecated name for identity still works (with a warning).
    with pytest.warns(DeprecationWarning, match="residual"):
        torch.testing.assert_close(attn(**inputs, residual=identity),
                                   attn(**inputs, identity=identity))
    # Training mode drops attention outputs only, never the residual.
    attn.train()
    torch.manual_seed(0)
    dropped = attn(**inputs, identity=torch.zeros_like(identity))
    assert (dropped == 0).float().mean().item() == pytest.approx(0.5, abs=0.1)


BAD_CONSTRUCTIONS = [
    # (arguments over ARGS, exception, words the message must contain)
    (dict(num_heads=0), ValueError, ["num_heads must be at least 1, got 0"]),
    (dict(num_levels=0), ValueError, ["num_levels must be at least 1, got 0"]),
    (dict(num_points=0), ValueError, ["num_points must be at least 1, got 0"]),
    (dict(embed_dims=30), ValueError, ["embed_dims = 30", "multiple of num_heads = 4"]),
    (dict(value_proj_ratio=0.3), ValueError, ["embed_dims * value_proj_ratio = 9"]),
    (dict(num_heads=4.0), TypeError, ["num_heads must be an int, got 4.0"]),
    (dict(num_points="3"), TypeError, ["num_points must be an int, got '3'"]),
    (dict(num_levels=True), TypeError, ["num_levels must be an int, got True"]),
    (dict(fp32_grad_accum="no"), TypeError, ["fp32_grad_accum", "'no'"]),
]


@pytest.mark.parametrize("case", range(len(BAD_CONSTRUCTIONS)))
def test_bad_constructor_arguments_raise_naming_them(case):
    """Guards: num_heads=0 failed with a bare ZeroDivisionError, num_levels=0
    and num_points=0 in init_weights or at the first forward, naming no
    argument; fp32_grad_accum='no' was taken and meant True."""
    changes, exc, words = BAD_CONSTRUCTIONS[case]
    with pytest.raises(exc) as info:
        TritonMSDeformAttn(**{**ARGS, **changes})
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_sizes_given_positionally_are_checked_too():
    with pytest.raises(ValueError, match="num_levels must be at least 1"):
        TritonMSDeformAttn(32, 4, 0)
    assert TritonMSDeformAttn(32, 4, 2, 3, fp32_grad_accum=np.bool_(False)).fp32_grad_accum \
        is False


def test_bad_reference_points_raise():
    attn = TritonMSDeformAttn(**ARGS)
    inputs = attention_inputs()
    with pytest.raises(ValueError, match=r"reference_points must end in 2 .* or 4"):
        attn(**{**inputs, "reference_points": inputs["reference_points"][..., :1]})
    with pytest.raises(ValueError, match="needs reference_points and spatial_shapes"):
        attn(**{**inputs, "reference_points": None})


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
def test_tensors_in_the_other_layout_raise_naming_batch_first(batch_first):
    attn = TritonMSDeformAttn(**{**ARGS, "batch_first": batch_first})
    inputs = attention_inputs(batch_first=not batch_first, B=2, Q=5)
    with pytest.raises(ValueError, match=rf"batch_first={batch_first}\) takes query as .*"
                                         r"\(B, Q\) = \(5, 2\).* has \(2, 5\)"):
        attn(**inputs)


@pytest.fixture
def op_calls(monkeypatch):
    """Record the dtypes of each call the module makes to msda_mm's op."""
    calls = []
    op = triton_ms_deform_attn.multi_scale_deformable_attention

    def recording_op(value, spatial_shapes, level_start_index, locations, weights, **kwargs):
        calls.append(dict(value=value.dtype, locations=locations.dtype, weights=weights.dtype,
                          **kwargs))
        return op(value, spatial_shapes, level_start_index, locations, weights, **kwargs)

    monkeypatch.setattr(triton_ms_deform_attn, "multi_scale_deformable_attention", recording_op)
    return calls


def test_bf16_autocast_keeps_locations_fp32(reference_backend, op_calls):
    attn = randomise(TritonMSDeformAttn(**ARGS))
    inputs = attention_inputs()
    # Reference points may themselves arrive in bf16 (e.g. from a bf16 head).
    inputs["reference_points"] = inputs["reference_points"].bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attn(**inputs)
    assert op_calls[0]["value"] == torch.bfloat16  # value_proj output, as autocast made it
    assert op_calls[0]["locations"] == torch.float32
    assert out.isfinite().all()
    # fp64 models keep fp64 locations (never narrowed to fp32).
    attn.double()(**attention_inputs(dtype=torch.float64))
    assert op_calls[1]["locations"] == torch.float64


@pytest.mark.parametrize("flag", ["fp32_grad_accum", "deterministic"])
def test_op_flags_reach_the_op(reference_backend, op_calls, flag):
    # The config key (e.g. --cfg-options
    # model.encoder.layer_cfg.self_attn_cfg.fp32_grad_accum=True) is passed
    # to every call; it is no parameter or buffer, so checkpoints still load.
    # deterministic=None follows torch.use_deterministic_algorithms in the op.
    default = TritonMSDeformAttn(**ARGS)
    forced = MODELS.build(dict(type="TritonMSDeformAttn", **{flag: True}, **ARGS))
    forced.load_state_dict(default.state_dict(), strict=True)
    default(**attention_inputs())
    forced(**attention_inputs())
    assert [c[flag] for c in op_calls] == [None, True]


def test_deterministic_must_be_a_bool():
    with pytest.raises(TypeError, match="deterministic must be None, True or False, got 'on'"):
        TritonMSDeformAttn(deterministic="on", **ARGS)


def test_fp32_compute_hands_the_op_an_fp32_value(reference_backend, op_calls):
    # Under bf16 autocast the projected value is bf16 (the test above);
    # fp32_compute casts it up before the op, so the op runs (and returns,
    # and differentiates) in fp32, and output_proj rounds as before.
    default = randomise(TritonMSDeformAttn(**ARGS))
    fp32 = MODELS.build(dict(type="TritonMSDeformAttn", fp32_compute=True, **ARGS))
    fp32.load_state_dict(default.state_dict(), strict=True)
    inputs = attention_inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_bf16, out_fp32 = default(**inputs), fp32(**inputs)
    assert [c["value"] for c in op_calls] == [torch.bfloat16, torch.float32]
    # Same values through the op: the results differ by output rounding only.
    torch.testing.assert_close(out_fp32, out_bf16, rtol=2e-2, atol=2e-2)
    # fp64 models stay fp64.
    fp32.double()(**attention_inputs(dtype=torch.float64))
    assert op_calls[-1]["value"] == torch.float64
    # A half model without autocast: the op in fp32, output_proj in bf16.
    fp32.bfloat16()(**attention_inputs(dtype=torch.bfloat16))
    assert op_calls[-1]["value"] == torch.float32
    with pytest.raises(TypeError, match="fp32_compute must be True or False"):
        TritonMSDeformAttn(fp32_compute="yes", **ARGS)


def test_module_on_triton_kernels_matches_reference(monkeypatch):
    # The one test through the kernels: CUDA if present, else Triton's
    # interpreter on CPU tensors (tiny shapes: the interpreter is slow).
    device = "cuda" if HAS_CUDA else "cpu"
    assert HAS_CUDA or os.environ.get("TRITON_INTERPRET") == "1", "tests/conftest.py sets it"
    attn = randomise(TritonMSDeformAttn(**ARGS)).to(device)
    inputs = attention_inputs(B=1, Q=3, device=device)

    def output_and_grads(module, kwargs):
        module.zero_grad()
        out = module(**kwargs)
        out.square().sum().backward()
        return [out] + [p.grad for p in module.parameters()]

    on_kernels = output_and_grads(attn, inputs)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    reference = output_and_grads(attn.cpu(), {k: v.cpu() for k, v in inputs.items()})
    for got, want in zip(on_kernels, reference, strict=True):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)


def test_module_compiles_to_one_graph_on_cpu(reference_backend):
    """Guards: torch.compile(fullgraph=True) of the module on CPU failed on
    the op's host check of the level sizes (a data-dependent guard)."""
    torch._dynamo.reset()
    attn = randomise(TritonMSDeformAttn(**ARGS))
    inputs = attention_inputs()
    counter = CompileCounter()
    compiled = torch.compile(attn, backend=counter, fullgraph=True)
    results = []
    for module in (compiled, attn):
        attn.zero_grad()
        out = module(**inputs)
        out.square().sum().backward()
        results.append([out] + [p.grad.clone() for p in attn.parameters()])
    assert counter.frame_count == 1
    # The same ops in the same order: equal up to fp32 rounding.
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.gpu
def test_cuda_forward_has_no_host_sync_and_mmcv_class_uses_triton():
    ours = randomise(TritonMSDeformAttn(**ARGS)).cuda()
    mmcv_attn = MultiScaleDeformableAttention(**ARGS).cuda()
    mmcv_attn.load_state_dict(ours.state_dict())
    inputs = attention_inputs(device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = ours(**inputs)
        out.float().square().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    # mmcv's class, typeless config, routes its CUDA path to the same op.
    torch.testing.assert_close(mmcv_attn(**inputs), ours(**inputs))
