"""The op as PyTorch sees it: gradcheck, torch.library opcheck, torch.compile,
gradient accumulation choice, deterministic mode (its numerics:
test_msda_deterministic.py)."""
import warnings

import pytest
import torch

from msda_mm import multi_scale_deformable_attention as msda
from msda_mm.ops import op as op_module
from msda_mm.ops.backward import launcher as backward_launcher
from msda_mm.ops.deterministic import grad_value

from msda_inputs import DEVICES, FLOAT_INPUTS, make_inputs, run_op


def _on(args, device):
    return {k: (v.to(device) if v is not None else None) for k, v in args.items()}


# softmax: attention_weights (uniform in [0, 1]) are logits, and the
# gradient is the logits'.  The interpreter runs two forwards per input
# element: the softmax case takes fewer (56) elements, each (query, head)
# still a softmax over 4 points.
@pytest.mark.parametrize("softmax,Q,M,D", [(False, 3, 2, 3), (True, 2, 1, 2)],
                         ids=["weights", "logits"])
@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_fp64(device, softmax, Q, M, D):
    # Locations away from pixel-grid kinks, where bilinear is differentiable.
    args, seed = make_inputs(B=1, Q=Q, M=M, D=D, shapes=((3, 4), (2, 2)), K=2,
                             dtype=torch.float64, lo=0.05, hi=0.95)
    a = _on(args, device)
    inputs = [a[k].requires_grad_() for k in FLOAT_INPUTS]

    def fn(value, loc, attn):
        return msda(value, a["spatial_shapes"], None, loc, attn, softmax=softmax)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5), f"seed {seed}"


def _op_args(device, dtype=torch.float32):
    args, _ = make_inputs(B=2, Q=5, M=2, D=8, dtype=dtype, device=device)
    return args


# softmax travels through both ops: the backward op takes the logits too
# (the deterministic one runs on their softmax inside it).
@pytest.mark.parametrize("deterministic,softmax", [(None, False), (True, False), (None, True),
                                                   (True, True)])
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_forward_and_backward(device, deterministic, softmax):
    a = _op_args(device)
    fwd_args = (a["value"].requires_grad_(), a["spatial_shapes"],
                a["sampling_locations"].requires_grad_(), a["attention_weights"].requires_grad_(),
                None, deterministic, softmax)
    torch.library.opcheck(torch.ops.msda_mm.msda_forward.default, fwd_args)
    grad_out = torch.randn(2, 5, 16, device=device)
    bwd_args = (grad_out, *(t.detach() for t in fwd_args[:4]), None, deterministic, softmax)
    torch.library.opcheck(torch.ops.msda_mm.msda_backward.default, bwd_args)


@pytest.mark.parametrize("softmax", [False, True], ids=["weights", "logits"])
@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device, softmax):
    """No graph break: the op is one opaque node forward and backward (with
    softmax too, the logits' gradient taken inside the backward op).  The
    CPU run uses aot_eager (Inductor's CPU codegen needs a C++ toolchain;
    the op itself is opaque either way); the GPU run uses Inductor."""
    a = _on(make_inputs()[0], device)
    backend = "inductor" if device == "cuda" else "aot_eager"

    def f(value, loc, attn):
        return msda(value, a["spatial_shapes"], None, loc, attn, softmax=softmax) * 2

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    eager_out, eager_grads, g = run_op(a, fn=lambda v, s, i, l, w: f(v, l, w))
    comp_out, comp_grads, _ = run_op(a, fn=lambda v, s, i, l, w: compiled(v, l, w), grad_out=g)
    torch.testing.assert_close(comp_out, eager_out)
    for k in FLOAT_INPUTS:
        # grad_value: atomics in another order, hence rounding-level slack.
        torch.testing.assert_close(comp_grads[k], eager_grads[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flag", [True, None], ids=["keyword", "global_mode"])
@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_deterministic_backward_is_the_eager_ones(device, flag):
    """deterministic=True, or None under use_deterministic_algorithms(True),
    travels through the compiled custom ops to the backward: bitwise the
    eager deterministic gradients."""
    a = _on(make_inputs()[0], device)
    backend = "inductor" if device == "cuda" else "aot_eager"

    def f(value, loc, attn):
        return msda(value, a["spatial_shapes"], None, loc, attn, deterministic=flag) * 2

    eager_out, eager_grads, g = run_op(
        a, fn=lambda v, s, i, l, w: msda(v, s, i, l, w, deterministic=True) * 2)
    prev = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(flag is None)
        compiled = torch.compile(f, fullgraph=True, backend=backend)
        _, comp_grads, _ = run_op(a, fn=lambda v, s, i, l, w: compiled(v, l, w), grad_out=g)
    finally:
        torch.use_deterministic_algorithms(prev)
    for k in FLOAT_INPUTS:
        torch.testing.assert_close(comp_grads[k], eager_grads[k], rtol=0, atol=0)


@pytest.mark.parametrize("capability,fp32", [((8, 0), True), ((8, 6), True), ((9, 0), False),
                                             ((10, 0), False)])
def test_auto_accumulator_follows_capability(monkeypatch, capability, fp32):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert op_module.bf16_atomics_are_slow(torch.device("cuda", 0)) is fp32


def test_auto_accumulator_per_dtype():
    resolve = op_module.resolve_fp32_grad_accum
    # CPU = Triton interpreter here: no bf16 atomics, so bf16 goes to fp32.
    assert resolve(torch.empty(1, dtype=torch.bfloat16), None) is True
    assert resolve(torch.empty(1, dtype=torch.float16), None) is False
    assert resolve(torch.empty(1, dtype=torch.float32), None) is False
    assert resolve(torch.empty(1, dtype=torch.float16), True) is True
    with pytest.raises(ValueError, match="fp32_grad_accum=False"):
        resolve(torch.empty(1, dtype=torch.bfloat16), False)


class _KernelSpy:
    """Stands in for a kernel: records the dtype of its argument ``arg`` (a
    grad_value pointer; None where none is passed), then runs it."""

    def __init__(self, kernel, arg):
        self.kernel, self.arg, self.accum_dtypes = kernel, arg, []

    def __getitem__(self, grid):
        def launch_(*args, **kwargs):
            gv = args[self.arg]
            self.accum_dtypes.append(None if gv is None else gv.dtype)
            return self.kernel[grid](*args, **kwargs)
        return launch_


def _bwd_spy(monkeypatch):
    spy = _KernelSpy(backward_launcher.msda_bwd_kernel, 5)  # grad_value_ptr
    monkeypatch.setattr(backward_launcher, "msda_bwd_kernel", spy)
    return spy


def _gather_spy(monkeypatch):
    spy = _KernelSpy(grad_value.grad_value_gather_kernel, 7)  # grad_value_ptr
    monkeypatch.setattr(grad_value, "grad_value_gather_kernel", spy)
    return spy


@pytest.mark.parametrize("dtype,flag,deterministic,accum", [
    (torch.bfloat16, None, None, torch.float32),
    (torch.bfloat16, True, None, torch.float32),
    (torch.float16, None, None, torch.float16),
    (torch.float16, True, None, torch.float32),
    (torch.float32, None, None, torch.float32),
    # The deterministic backward adds no grad_value in msda_bwd_kernel,
    # whatever fp32_grad_accum says (even False for bf16, which the
    # interpreter could not run): the gather kernel writes it.
    (torch.bfloat16, False, True, None),
    (torch.float16, True, True, None),
    (torch.float64, None, True, None),
], ids=str)
def test_backward_uses_selected_accumulator(monkeypatch, dtype, flag, deterministic, accum):
    spy, gather = _bwd_spy(monkeypatch), _gather_spy(monkeypatch)
    args, _ = make_inputs(dtype=dtype)
    _, grads, _ = run_op(args, fp32_grad_accum=flag, deterministic=deterministic)
    assert spy.accum_dtypes == [accum]
    # It sums in registers and stores value's dtype.
    assert gather.accum_dtypes == ([dtype] if deterministic else [])
    assert grads["value"].dtype == dtype


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_mode_runs_the_fixed_point_backward(monkeypatch, device):
    # use_deterministic_algorithms(True) takes the fixed-point backward instead
    # of raising: the gradients of deterministic=True, bit for bit, silently.
    spy, gather = _bwd_spy(monkeypatch), _gather_spy(monkeypatch)
    a = _on(make_inputs()[0], device)
    _, det, g = run_op(a, deterministic=True)
    prev = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _, grads, _ = run_op(a, grad_out=g)
    finally:
        torch.use_deterministic_algorithms(prev)
    assert spy.accum_dtypes == [None, None]
    assert gather.accum_dtypes == [torch.float32, torch.float32]
    for k in FLOAT_INPUTS:
        torch.testing.assert_close(grads[k], det[k], rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_mode_raises_or_warns_only_when_forced_off(device):
    # deterministic=False asks for the float atomics, which have no
    # deterministic implementation: PyTorch's convention then applies.
    a = _on(make_inputs()[0], device)
    prev, prev_warn = (torch.are_deterministic_algorithms_enabled(),
                       torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        torch.use_deterministic_algorithms(True)
        msda(**a, deterministic=False)  # the forward has no atomics: allowed
        with pytest.raises(RuntimeError, match="deterministic implementation"):
            run_op(a, deterministic=False)
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="deterministic implementation"):
            out, grads, g = run_op(a, deterministic=False)
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=prev_warn)
    ref_out, ref_grads, _ = run_op(a, grad_out=g)
    torch.testing.assert_close(grads["sampling_locations"], ref_grads["sampling_locations"])


def test_deterministic_flag_must_be_a_bool():
    args, _ = make_inputs()
    with pytest.raises(TypeError, match="deterministic must be None, True or False, got 1"):
        msda(**args, deterministic=1)


def test_deterministic_mode_cpu_reference_is_silent(reference_backend):
    args, _ = make_inputs()
    prev = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            run_op(args)
    finally:
        torch.use_deterministic_algorithms(prev)
