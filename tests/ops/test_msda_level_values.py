"""spatial_shapes and level_start_index values: checked against each other
and against value's S where reading them is free (CPU tensors, on the
interpreted kernels and on the reference alike); on the Triton path each
kernel derives the starts from the shapes, and never reads the passed ones."""
import pytest
import torch

from msda_mm import msda_reference
from msda_mm import multi_scale_deformable_attention as msda
from msda_mm.ops import op as op_module

from msda_inputs import assert_close_to_reference, make_inputs, rel_err

BACKENDS = ["interp", "reference"]
# make_inputs' levels (4, 5) and (2, 3): S = 26, starts [0, 20].
BAD_LEVELS = [
    # (spatial_shapes, level_start_index, words the message must contain)
    (None, [1, 21], ["level_start_index [1, 21]", "start at [0, 20]"]),  # shifted
    (None, [0, 11], ["level_start_index [0, 11]", "start at [0, 20]"]),
    (None, [20, 0], ["level_start_index [20, 0]", "start at [0, 20]"]),  # decreasing
    (None, [-2, 20], ["level_start_index [-2, 20]"]),  # negative
    ([[-4, -5], [2, 3]], None, ["spatial_shapes", "positive", "[[-4, -5], [2, 3]]"]),
    ([[26, 1], [0, 7]], None, ["spatial_shapes", "positive", "[0, 7]"]),
    # 2**32 * 2**32 wraps to 0 in int64, so these shapes "cover" 0 + 26 = S
    # there: only exact arithmetic sees that they do not.
    ([[2**32, 2**32], [2, 13]], None, ["spatial_shapes", "18446744073709551642", "S=26"]),
]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    if request.param == "reference":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    return request.param


@pytest.mark.parametrize("case", range(len(BAD_LEVELS)))
def test_level_values_that_disagree_raise(backend, case):
    """Guards: shifted, decreasing or negative starts, negative or empty
    levels and an int64-wrapping H * W raised nothing (interpreted kernels:
    output off by up to 2.55) or an unnamed reshape error (reference)."""
    shapes, starts, words = BAD_LEVELS[case]
    args = make_inputs(B=1, Q=3, M=2, D=4, K=2)[0]
    if shapes is not None:
        args["spatial_shapes"] = torch.tensor(shapes)
    if starts is not None:
        args["level_start_index"] = torch.tensor(starts)
    with pytest.raises(ValueError) as info:
        msda(**args)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_reference_checks_the_levels_it_reads():
    """Guards: msda_reference called directly took a wrong index as given."""
    args = make_inputs(B=1, Q=3, M=2, D=4, K=2)[0]
    with pytest.raises(ValueError, match=r"level_start_index \[0, 11\] disagrees"):
        msda_reference(args["value"], args["spatial_shapes"], args["sampling_locations"],
                       args["attention_weights"], torch.tensor([0, 11]))


def test_triton_path_derives_starts_and_never_reads_the_passed_ones(monkeypatch):
    """Guards: with the host check out of the way (as for CUDA tensors, whose
    values it cannot read), a passed index that disagrees with the shapes
    gave garbage; the kernels must see the starts derived from the shapes."""
    monkeypatch.setattr(op_module, "check_levels", lambda *args: None)
    args, seed = make_inputs(B=1, Q=4, M=2, D=4, K=2)
    right = msda(**args)
    wrong = msda(**dict(args, level_start_index=torch.tensor([1, 13])))
    ref = msda_reference(args["value"], args["spatial_shapes"], args["sampling_locations"],
                         args["attention_weights"])
    torch.testing.assert_close(wrong, right, rtol=0, atol=0, msg=f"seed {seed}")
    assert rel_err(right, ref) <= 32 * 2.0**-24, f"seed {seed}"


def test_non_contiguous_shapes_are_read_as_their_values():
    """Guards: the kernels read (L, 2) shapes as contiguous rows, so a
    transposed view ((4, 2), (5, 3)).t() was read as (4, 2), (5, 3)."""
    args, seed = make_inputs(B=1, Q=4, M=2, D=4, K=2)
    transposed = torch.tensor([[4, 2], [5, 3]]).t()
    assert not transposed.is_contiguous()
    torch.testing.assert_close(msda(**dict(args, spatial_shapes=transposed)), msda(**args),
                               rtol=0, atol=0, msg=f"seed {seed}")


# Five levels of unequal sizes: every kernel derives each level's start from
# the shapes as it runs (sampling.level_start, the pairs kernel's running sum,
# the gather's _row_levels); a start off by one row shows in every output.
FIVE_LEVELS = ((5, 7), (3, 4), (2, 2), (1, 3), (1, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pairs", [False, True], ids=["fwd_kernel", "pairs_kernel"])
def test_kernels_derive_the_starts_of_five_levels(dtype, pairs, request):
    """Forward (msda_fwd_kernel, or msda_fwd_pairs_kernel forced) and the
    float-atomic backward against the fp64 reference."""
    launches = request.getfixturevalue("pairs_launches") if pairs else None
    args, seed = make_inputs(B=1, Q=5, M=2, D=4, K=2, shapes=FIVE_LEVELS, dtype=dtype, lo=0.0,
                             hi=1.0)
    assert_close_to_reference(args, "cpu", seed)
    assert launches is None or len(launches) == 1


def test_deterministic_gathers_derive_the_starts_of_five_levels(sort):
    """grad_value_gather_kernel finds each value row's level and start from
    the shapes alone, under both sorts."""
    args, seed = make_inputs(B=1, Q=5, M=2, D=4, K=2, shapes=FIVE_LEVELS, lo=0.0, hi=1.0)
    assert_close_to_reference(args, "cpu", seed, deterministic=True)


@pytest.mark.gpu
def test_cuda_ignores_a_disagreeing_index_without_a_sync():
    """On CUDA the index's values are not read (they could not be checked
    without a sync): a wrong one gives the same result as the right one,
    and the call does not synchronise."""
    args = {k: (v.cuda() if v is not None else None) for k, v in
            make_inputs(B=2, Q=40, M=4, D=32, shapes=((16, 20), (8, 10)), K=4)[0].items()}
    right = msda(**args)
    # Made before the check: a copy from pageable host memory synchronises.
    wrong_index = torch.tensor([3, 7], device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        wrong = msda(**dict(args, level_start_index=wrong_index))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(wrong, right, rtol=0, atol=0)
