#!/usr/bin/env python
"""The attention part of TritonMSDeformAttn (softmax of the attention logits,
then the op) with the softmax fused into the op's forward kernel against a
separate softmax, timed both ways in one process.

    python research/fused_softmax.py [--presets decoder,dino_decoder,encoder]
        [--dtypes bf16,fp32] [--budget-ms 100] [--out benchmarks]

unfused: ``point_softmax(logits)`` then the op, which is mmcv's
``.softmax(-1)`` as autocast runs it (fp32 weights out of 16-bit logits);
fused: the op with ``softmax=True``.  Logits in the value's dtype (the
attention_weights Linear's output under AMP), locations fp32, the
benchmark's inputs (the logits are the log of its weights).  For each
preset, dtype and mode: device time of the forward and of forward +
torch.autograd.grad (CUDA-graph replay after an L2 flush, as
tools/benchmark.py's fwd_us / fwdbwd_us), peak memory during the forward
and the backward and what the forward keeps for the backward (MiB above the
inputs), then the saving (unfused minus fused), and the largest difference
between the two modes' output and gradients (relative to the unfused
one's largest magnitude).  Writes <out>/<device-slug>-fused-softmax.json.
On CPU (--device cpu, TRITON_INTERPRET=1) eager times in the interpreter
and no memory figures.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Runs as `python research/fused_softmax.py` from a checkout, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.op.cli import names  # noqa: E402
from bench.op.presets import PRESETS  # noqa: E402
from bench.op.report import write_results  # noqa: E402
from bench.op.run import DTYPES, preset_inputs  # noqa: E402
from bench.op.timing import eager_times_us, graph_times_us, peak_memory_mb  # noqa: E402
from msda_mm.ops import multi_scale_deformable_attention, point_softmax  # noqa: E402
from msda_mm.ops.runtime import interpreter_enabled  # noqa: E402

MODES = ("unfused", "fused")
# Numbers each mode gets, and the saving (unfused - fused) of each.
FIELDS = ("fwd_us", "fwdbwd_us", "peak_fwd_mb", "kept_mb", "peak_bwd_mb")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", type=names(PRESETS),
                        default=("decoder", "dino_decoder", "encoder"))
    parser.add_argument("--dtypes", type=names(DTYPES), default=("bf16", "fp32"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--budget-ms", type=float, default=100.0,
                        help="timing budget per measurement (default 100)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks"))
    args = parser.parse_args(argv)
    if args.device == "cpu" and not interpreter_enabled():
        # The op would run the PyTorch reference: no kernel to fuse into.
        parser.error("--device cpu needs TRITON_INTERPRET=1 (the kernels in Triton's "
                     "interpreter)")
    return args


def attention(mode: str, shapes: torch.Tensor, starts: torch.Tensor):
    """(value, locations, logits) -> output of the attention part in ``mode``."""
    if mode == "fused":
        return lambda v, loc, logits: multi_scale_deformable_attention(
            v, shapes, starts, loc, logits, softmax=True)
    return lambda v, loc, logits: multi_scale_deformable_attention(
        v, shapes, starts, loc, point_softmax(logits))


def measure(fn, leaves: tuple, grad_output: torch.Tensor, budget_ms: float) -> dict:
    """FIELDS of ``fn(*leaves)`` (memory: None on CPU)."""
    device = grad_output.device

    def forward():
        return fn(*leaves)

    def forward_backward():
        return torch.autograd.grad(fn(*leaves), leaves, grad_output)

    cell = dict.fromkeys(FIELDS)
    if device.type == "cuda":
        state = {}
        # The middle step does nothing: its "peak" is what the forward kept.
        cell["peak_fwd_mb"], cell["kept_mb"], cell["peak_bwd_mb"] = peak_memory_mb(
            device, lambda: state.update(out=forward()), lambda: None,
            lambda: torch.autograd.grad(state.pop("out"), leaves, grad_output))
        cell["fwd_us"] = graph_times_us(forward, device, budget_ms)[0]
        cell["fwdbwd_us"] = graph_times_us(forward_backward, device, budget_ms)[0]
    else:
        cell["fwd_us"] = eager_times_us(forward, device, budget_ms)[0]
        cell["fwdbwd_us"] = eager_times_us(forward_backward, device, budget_ms)[0]
    return cell


def max_rel_diff(fns: dict, leaves: tuple, grad_output: torch.Tensor) -> float:
    """Largest |fused - unfused| over the output and the three gradients,
    each relative to the unfused tensor's largest magnitude."""
    results = {}
    for mode, fn in fns.items():
        out = fn(*leaves)
        results[mode] = (out, *torch.autograd.grad(out, leaves, grad_output))
    return max(((f.double() - u.double()).abs().max() / u.double().abs().max()).item()
               for f, u in zip(results["fused"], results["unfused"]))


def _line(cell: dict) -> str:
    def num(key, unit):
        return "-" if cell[key] is None else f"{cell[key]:9.1f} {unit}"
    return (f"{cell['preset']:13s} {cell['dtype']:5s} {cell['mode']:8s} fwd {num('fwd_us', 'us')}"
            f"  fwd+bwd {num('fwdbwd_us', 'us')}  peak fwd {num('peak_fwd_mb', 'MiB')}"
            f"  kept {num('kept_mb', 'MiB')}  peak bwd {num('peak_bwd_mb', 'MiB')}")


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    cells = []
    for name, dname, x in preset_inputs(args.presets, args.dtypes, device):
        leaves = tuple(t.detach().requires_grad_() for t in (
            x.value, x.sampling_locations, x.attention_weights.log().to(x.value.dtype)))
        fns = {mode: attention(mode, x.spatial_shapes, x.level_start_index) for mode in MODES}
        rows = {mode: dict(preset=name, dtype=dname, mode=mode,
                           **measure(fn, leaves, x.grad_output, args.budget_ms))
                for mode, fn in fns.items()}
        saving = dict(preset=name, dtype=dname, mode="saving",
                      **{k: None if rows["fused"][k] is None
                         else rows["unfused"][k] - rows["fused"][k] for k in FIELDS},
                      max_rel_diff=max_rel_diff(fns, leaves, x.grad_output))
        for cell in (*rows.values(), saving):
            cells.append(cell)
            print(_line(cell), flush=True)
        print(f"{name:13s} {dname:5s} fused against unfused: max relative difference "
              f"{saving['max_rel_diff']:.1e}", flush=True)
    write_results(args.out, device, "fused-softmax", cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
