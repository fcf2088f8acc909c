"""check_inputs answers a valid call in one expression and leaves every other
call to the checks that name what is wrong: each way an input can be wrong
still raises, also those that tests/ops/test_msda_validation.py does not
try through the op."""
import pytest
import torch

from msda_mm.ops.validate import check_inputs

from msda_inputs import make_inputs

NAMES = ("value", "spatial_shapes", "level_start_index", "sampling_locations",
         "attention_weights")


def _args():
    args = make_inputs(B=2, Q=5, M=2, D=8, K=2)[0]  # L = 2, S = 26
    args["level_start_index"] = torch.tensor([0, 20])
    return args


def _check(args):
    check_inputs(*(args[name] for name in NAMES))


@pytest.mark.parametrize("start_index", [True, False], ids=["index", "no_index"])
def test_a_valid_call_passes(start_index):
    args = _args()
    if not start_index:
        args["level_start_index"] = None
    _check(args)


CASES = [
    # (override, exception, words the message must contain)
    *[(lambda a, n=name: {n: a[n].to("meta")}, ValueError, ["one device", f"{name}: meta"])
      for name in NAMES],
    (lambda a: dict(level_start_index=a["level_start_index"].to(torch.int16)), TypeError,
     ["level_start_index", "int16"]),
    (lambda a: dict(level_start_index=[0, 20]), TypeError, ["level_start_index", "list"]),
    (lambda a: dict(attention_weights=1.0), TypeError, ["attention_weights", "float"]),
    (lambda a: dict(sampling_locations=a["sampling_locations"][..., None]), ValueError,
     ["sampling_locations", "(B, Q, M, L, K, 2)"]),
    (lambda a: dict(spatial_shapes=a["spatial_shapes"][:, :1]), ValueError,
     ["spatial_shapes", "(L, 2)"]),
    (lambda a: dict(spatial_shapes=a["spatial_shapes"][None]), ValueError,
     ["spatial_shapes", "(L, 2)"]),
    (lambda a: dict(level_start_index=a["level_start_index"][None]), ValueError,
     ["level_start_index", "(2,)"]),
    (lambda a: dict(attention_weights=a["attention_weights"].transpose(0, 1)), ValueError,
     ["attention_weights", "(2, 5, 2, 2, 2)"]),
    (lambda a: dict(sampling_locations=a["sampling_locations"][:, :, :, :0],
                    attention_weights=a["attention_weights"][:, :, :, :0],
                    spatial_shapes=a["spatial_shapes"][:0], level_start_index=None), ValueError,
     ["at least one level", "L=0"]),
    (lambda a: dict(sampling_locations=a["sampling_locations"][:, :, :, :, :0],
                    attention_weights=a["attention_weights"][..., :0]), ValueError,
     ["at least one level and one point", "K=0"]),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_every_wrong_input_raises_naming_it(case):
    build, exc, words = CASES[case]
    args = _args()
    args.update(build(args))
    with pytest.raises(exc) as info:
        _check(args)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
