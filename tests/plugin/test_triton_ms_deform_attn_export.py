"""torch.export of TritonMSDeformAttn: the exported program runs and matches
eager.  Through the kernels (CUDA, or the interpreter on CPU) the graph calls
msda_mm's custom op (its fake implementation traces it; no decomposition);
the CPU reference path exports as its PyTorch decomposition, general over the
level shapes (read as unbacked sizes, not baked in)."""
import os

import pytest
import torch

from msda_mm import TritonMSDeformAttn

from .test_triton_ms_deform_attn import ARGS, HAS_CUDA, attention_inputs, randomise

STRICT = pytest.mark.parametrize("strict", [False, True], ids=["non_strict", "strict"])


def _export(device, strict, **input_kw):
    module = randomise(TritonMSDeformAttn(**ARGS)).eval().to(device)
    inputs = attention_inputs(device=device, **input_kw)
    return module, inputs, torch.export.export(module, (), inputs, strict=strict)


def _targets(program) -> set:
    return {n.target for n in program.graph.nodes if n.op == "call_function"}


def _msda_nodes(program) -> list:
    return [n for n in program.graph.nodes if n.target is torch.ops.msda_mm.msda_forward.default]


def _check_calls_the_op(module, inputs, program):
    for graph in (program, program.run_decompositions()):
        (node,) = _msda_nodes(graph)
        assert node.args[-1] is True  # softmax: the module hands the op its logits
        assert torch.ops.aten.grid_sampler.default not in _targets(graph)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(**inputs), module(**inputs),
                                   rtol=0, atol=0)


@STRICT
def test_reference_path_exports_as_pytorch_for_any_level_shapes(reference_backend, strict):
    module, inputs, program = _export("cpu", strict, B=1, Q=3)
    assert not _msda_nodes(program)
    assert torch.ops.aten.grid_sampler.default in _targets(program)
    # Other level shapes with the same S = 30: the program reads them at run time.
    shapes = torch.tensor([[5, 4], [5, 2]])
    other = dict(inputs, spatial_shapes=shapes, level_start_index=torch.tensor([0, 20]))
    with torch.no_grad():
        for kwargs in (inputs, other):
            torch.testing.assert_close(program.module()(**kwargs), module(**kwargs),
                                       rtol=0, atol=0)


@STRICT
def test_interpreter_path_exports_the_custom_op(strict):
    assert HAS_CUDA or os.environ.get("TRITON_INTERPRET") == "1", "conftest.py sets it"
    _check_calls_the_op(*_export("cpu", strict, B=1, Q=3))


@pytest.mark.gpu
@STRICT
def test_cuda_export_calls_the_custom_op(strict):
    _check_calls_the_op(*_export("cuda", strict))
