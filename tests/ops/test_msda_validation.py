"""Bad input gets a ValueError/TypeError naming the argument, never an
assert, a crash or garbage."""
import numpy as np
import pytest
import torch

from msda_mm import multi_scale_deformable_attention as msda

from msda_inputs import make_inputs

CASES = [
    # (override builder, exception, words the message must contain)
    (lambda a: dict(value=a["value"][0]), ValueError, ["value", "(B, S, M, D)", "(26"]),
    (lambda a: dict(sampling_locations=a["sampling_locations"][..., :1]), ValueError,
     ["sampling_locations", "(B, Q, M, L, K, 2)"]),
    (lambda a: dict(attention_weights=a["attention_weights"][..., 0]), ValueError,
     ["attention_weights", "(B, Q, M, L, K)"]),
    (lambda a: dict(sampling_locations=a["sampling_locations"][:1]), ValueError,
     ["sampling_locations", "batch B or heads M"]),
    (lambda a: dict(value=a["value"][:, :, :1]), ValueError, ["value", "batch B or heads M"]),
    (lambda a: dict(attention_weights=a["attention_weights"][:, :4]), ValueError,
     ["attention_weights", "(2, 5, 2, 2, 2)"]),
    (lambda a: dict(attention_weights=a["attention_weights"][..., :1]), ValueError,
     ["attention_weights"]),
    (lambda a: dict(spatial_shapes=a["spatial_shapes"][:1]), ValueError,
     ["spatial_shapes", "levels"]),
    (lambda a: dict(spatial_shapes=torch.tensor([[4, 5], [3, 3]])), ValueError,
     ["spatial_shapes", "S=26"]),
    (lambda a: dict(level_start_index=torch.tensor([0, 20, 26])), ValueError,
     ["level_start_index", "(2,)"]),
    (lambda a: dict(value=a["value"].long()), TypeError, ["value", "int64"]),
    (lambda a: dict(sampling_locations=a["sampling_locations"].to(torch.int32)), TypeError,
     ["sampling_locations", "int32"]),
    (lambda a: dict(attention_weights=a["attention_weights"].bool()), TypeError,
     ["attention_weights", "bool"]),
    (lambda a: dict(spatial_shapes=a["spatial_shapes"].float()), TypeError,
     ["spatial_shapes", "float32"]),
    (lambda a: dict(level_start_index=torch.tensor([0.0, 20.0])), TypeError,
     ["level_start_index", "float32"]),
    (lambda a: dict(value=a["value"].numpy()), TypeError, ["value", "ndarray"]),
    (lambda a: dict(spatial_shapes=[[4, 5], [2, 3]]), TypeError, ["spatial_shapes", "list"]),
    (lambda a: dict(value=a["value"].to("meta")), ValueError, ["one device", "value: meta"]),
    # Truthy non-bools silently meant True.
    (lambda a: dict(fp32_grad_accum="no"), TypeError, ["fp32_grad_accum", "'no'"]),
    (lambda a: dict(fp32_grad_accum=1), TypeError, ["fp32_grad_accum", "None, True or False"]),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_bad_input_raises_clear_error(case):
    build, exc, words = CASES[case]
    args = make_inputs(B=2, Q=5, M=2, D=8, K=2)[0]  # S = 4*5 + 2*3 = 26
    args.update(build(args))
    with pytest.raises(exc) as info:
        msda(**args)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_numpy_bool_fp32_grad_accum_is_a_bool(monkeypatch):
    # Guards: a numpy bool (as configs built with numpy may hold) stays
    # accepted once only None/True/False are, and reaches the op as a bool.
    from msda_mm.ops import op as op_module
    seen = []
    # apply(value, shapes, locations, weights, fp32_grad_accum, ...)
    monkeypatch.setattr(op_module.EagerMSDA, "apply",
                        lambda *args: seen.append(args[4]) or args[0].new_zeros(1))
    args = make_inputs(B=1, Q=2, M=2, D=8, K=2)[0]
    msda(**args, fp32_grad_accum=np.bool_(True))
    assert seen == [True] and type(seen[0]) is bool


@pytest.mark.parametrize("shape", [(1, 2**31, 1, 1), (65536, 1, 1, 1), (1, 1, 65536, 1)])
def test_launcher_refuses_shapes_past_the_grid_or_int32_positions(shape):
    from msda_mm.ops import runtime
    with pytest.raises(ValueError, match=r"at most 65535 batches B and heads M .* 2\*\*31"):
        runtime.grid(torch.empty(shape, device="meta"), 10, 2)
