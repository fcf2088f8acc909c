"""mmcv's own PyTorch MSDA as an external truth (it imports on mmcv-lite once
msda_mm has stubbed mmcv._ext)."""
import pytest
import torch
from mmcv.ops.multi_scale_deform_attn import multi_scale_deformable_attn_pytorch

import msda_mm  # noqa: F401  (mmcv-lite shims before mmcv.ops is imported)

from msda_inputs import DEVICES, FLOAT_INPUTS, make_inputs, rel_err, run_op


@pytest.mark.parametrize("device", DEVICES)
def test_matches_mmcv_pytorch_implementation(device):
    # Locations inside [0, 1] and all-finite: where mmcv's function is defined
    # the same way as ours (it returns NaN for non-finite locations).
    args, seed = make_inputs(B=2, Q=9, M=2, D=8, shapes=((6, 7), (3, 4)), K=3,
                             dtype=torch.float64, lo=0.0, hi=1.0)

    def mmcv_fn(value, spatial_shapes, level_start_index, loc, attn):
        return multi_scale_deformable_attn_pytorch(value, spatial_shapes, loc, attn)

    ours_args = {k: (v.to(device) if v is not None else None) for k, v in args.items()}
    out, grads, g = run_op(ours_args)
    ref_out, ref_grads, _ = run_op(args, fn=mmcv_fn, grad_out=g.cpu())
    assert rel_err(out, ref_out) < 1e-12, f"seed {seed}"
    for k in FLOAT_INPUTS:
        assert rel_err(grads[k], ref_grads[k]) < 1e-12, (k, seed)
