"""torch.compile of msda_mm's op on CPU (the PyTorch reference): one graph
with fullgraph=True, no graph break without it, the eager numbers."""
import torch
from torch._dynamo.testing import CompileCounter

from msda_mm import multi_scale_deformable_attention as msda

from msda_inputs import FLOAT_INPUTS, make_inputs, run_op


def test_reference_op_compiles_to_one_graph_with_eager_numbers(reference_backend):
    """Guards: validate.py's host check of the level sizes (``if total !=
    S`` on tensor values) failed fullgraph=True with a data-dependent guard
    and broke the graph without it.  The level values stay checked in
    eager mode (tests/ops/test_msda_level_values.py)."""
    torch._dynamo.reset()
    args, seed = make_inputs(B=2, Q=5, M=2, D=8, K=2)
    args["level_start_index"] = torch.tensor([0, 20])
    counter = CompileCounter()
    compiled = torch.compile(msda, backend=counter, fullgraph=True)
    out, grads, grad_out = run_op(args, fn=compiled)
    ref_out, ref_grads, _ = run_op(args, grad_out=grad_out)
    assert counter.frame_count == 1
    # The same ops in the same order: equal up to fp32 rounding.
    torch.testing.assert_close(out, ref_out, msg=f"seed {seed}")
    for k in FLOAT_INPUTS:
        torch.testing.assert_close(grads[k], ref_grads[k], msg=f"{k}, seed {seed}")

    # Without fullgraph: no break either, once the reference's reads of the
    # level shapes (grid_sample needs ints) are traced as fullgraph traces
    # them (capture_scalar_outputs, which fullgraph=True turns on).
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        explained = torch._dynamo.explain(msda)(**args)
    assert explained.graph_break_count == 0, explained.break_reasons
