"""softmax=True: attention_weights are logits, and the forward kernels take
their softmax over the L * K points of each (query, head).  Output and
gradients (the logits' included) against point_softmax followed by the
reference, for both forward kernels, several chunks of points, partial
query blocks and extreme logits."""
import pytest
import torch

from msda_mm import multi_scale_deformable_attention as msda
from msda_mm.ops.tiles import tile_override

from msda_inputs import (
    DEVICES,
    assert_close_to_reference,
    logit_inputs,
    make_inputs,
    run_op,
    softmax_reference,
)


def check(args, device, seed):
    assert_close_to_reference(args, device, seed, reference=softmax_reference, softmax=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value_dtype,other_dtype", [
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.float32),  # mmdet's bf16 AMP with fp32 logits
    (torch.bfloat16, torch.bfloat16),  # AMP: the attention_weights Linear's bf16 output
    (torch.float16, torch.float16),
], ids=str)
def test_dtypes(device, value_dtype, other_dtype):
    args, seed = logit_inputs(dtype=value_dtype, loc_dtype=torch.float32,
                              attn_dtype=other_dtype)
    check(args, device, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("L,K", [(1, 1), (2, 3), (5, 5)])
def test_levels_and_points(device, L, K):
    # (5, 5): 25 points, two chunks of msda_fwd_kernel's 16, the second partial.
    shapes = [(7, 5), (4, 3), (2, 2), (1, 3), (1, 1)][:L]
    args, seed = logit_inputs(B=1, Q=5, M=2, D=8, shapes=shapes, K=K)
    check(args, device, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_small_tiles_partial_query_blocks_and_chunks(device):
    # 4 queries x 4 points a program over Q = 7 and 10 points: masked query
    # rows, three chunks, the last one half empty.
    args, seed = logit_inputs(B=2, Q=7, M=2, D=8, shapes=((4, 5), (2, 3)), K=5)
    with tile_override(fwd=(4, 1, 4)):
        check(args, device, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("K", [1, 3])  # 2 and 6 points: the max pass's tile of 8 half empty
def test_pairs_kernel(device, dtype, K, pairs_launches):
    args, seed = logit_inputs(B=2, Q=7, M=2, D=8, K=K, dtype=dtype, loc_dtype=torch.float32,
                              attn_dtype=torch.float32)
    check(args, device, seed)
    assert pairs_launches, "the pairs kernel did not run"


# The all -inf row: -inf - (-inf) is NaN in the interpreter's NumPy, as in torch.
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pairs", [False, True], ids=["fwd", "pairs"])
def test_extreme_logits(device, pairs):
    # Logits of +-3e4 (exp overflows fp32 past 88: only a max-subtracting
    # softmax is finite), -inf on some points (masked out: weight 0), and
    # one (query, head) all -inf, which torch's softmax makes NaN.
    dtype = torch.float16 if pairs else torch.float32
    args, seed = make_inputs(B=1, Q=6, M=2, D=8, K=3, dtype=dtype, loc_dtype=torch.float32,
                             attn_dtype=torch.float32, lo=0.0, hi=1.0)
    g = torch.Generator().manual_seed(seed)
    logits = (torch.rand(args["attention_weights"].shape, generator=g) * 2 - 1) * 3e4
    logits[0, 1, 0, 0, 1:] = -float("inf")
    logits[0, 2, 1, 1] = -float("inf")
    logits[0, 3, 1] = -float("inf")
    args["attention_weights"] = logits
    on = {k: (v.to(device) if v is not None else None) for k, v in args.items()}
    with tile_override(**({"pairs": (4, 1)} if pairs else {})):
        out = msda(**on, softmax=True)
    want = softmax_reference(args["value"].double(), args["spatial_shapes"], None,
                             args["sampling_locations"].double(), logits.double())
    nan_rows = torch.zeros(out.shape, dtype=torch.bool).view(1, 6, 2, -1)
    nan_rows[0, 3, 1] = True
    assert torch.equal(out.cpu().isnan(), nan_rows.view(out.shape)), f"seed {seed}"
    # fp16 output: 2**-11 rounding of O(1) values; fp32: rounding-level error
    # of sums over 6 points of 4 corners.
    tol = 2e-3 if pairs else 1e-5
    torch.testing.assert_close(out.cpu().double(), want, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_shift_invariance(device):
    # softmax(l + c) = softmax(l) for any c per (query, head): the fused
    # kernel must give the same output and logits gradient (the gradient's
    # sum over each row's points is 0).
    args, seed = logit_inputs(B=1, Q=5, M=2, D=8, dtype=torch.float64)
    args = {k: (v.to(device) if v is not None else None) for k, v in args.items()}
    out, grads, g = run_op(args, softmax=True)
    shift = torch.randn(args["attention_weights"].shape[:3], dtype=torch.float64,
                        device=device)[..., None, None] * 50
    shifted = dict(args, attention_weights=args["attention_weights"] + shift)
    out2, grads2, _ = run_op(shifted, grad_out=g, softmax=True)
    torch.testing.assert_close(out2, out, rtol=1e-12, atol=1e-12)
    for k in grads:
        torch.testing.assert_close(grads2[k], grads[k], rtol=1e-10, atol=1e-12)
    row_sums = grads["attention_weights"].flatten(-2).sum(-1)
    torch.testing.assert_close(row_sums, torch.zeros_like(row_sums), rtol=0, atol=1e-12)


def test_softmax_must_be_a_bool():
    args, _ = make_inputs()
    with pytest.raises(TypeError, match="softmax must be True or False, got 1"):
        msda(**args, softmax=1)
