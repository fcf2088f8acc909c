"""Ahead-of-time compilation of the MSDA kernels for GPUs that are not here.

Each variant is compiled with exactly the arguments the launcher passes: the
call is recorded from the launchers on meta tensors, then specialised the way
``JITFunction.run`` does it (pointer alignment, 16-divisible ints, ints equal
to 1 becoming constexprs) and compiled for the chosen sm target.  The PTX and
the SASS of the cubin (disassembled with the cuobjdump in Triton's wheel) say
which atomics the backward got and how wide the forward's loads are.  No GPU
and no CUDA driver are needed; the Triton interpreter must be off
(``TRITON_INTERPRET`` unset), because interpreted kernels cannot be compiled.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import re
import subprocess
import tempfile
import time
import types
from pathlib import Path
from typing import Optional
from unittest import mock

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

from bench.op.presets import PRESETS
from msda_mm.ops import resolve_fp32_grad_accum
from msda_mm.ops.backward import launcher as backward_launcher
from msda_mm.ops.deterministic import buckets, grad_value
from msda_mm.ops.forward import launcher as forward_launcher

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
KERNELS = ("fwd", "fwd_pairs", "bwd", "bound", "bucket_fill", "gather", "stable_bwd",
           "sorted_fill", "stable_gather")
# The deterministic backward's grad_value kernels (msda_mm/ops/deterministic/: the
# counting sort's; the stable sort's and the gather's float pass).
DET_KERNELS = KERNELS[3:]
# The stable sort's, compiled for the encoder's call (its rows take it).
STABLE_KERNELS = KERNELS[6:]
# Each KERNELS name's launcher module and the kernel's attribute there.
_LAUNCHED = {"fwd": (forward_launcher, "msda_fwd_kernel"),
             "fwd_pairs": (forward_launcher, "msda_fwd_pairs_kernel"),
             "bwd": (backward_launcher, "msda_bwd_kernel"),
             "bound": (buckets, "grad_value_bound_kernel"),
             "bucket_fill": (buckets, "bucket_fill_kernel"),
             "gather": (grad_value, "grad_value_gather_kernel"),
             "stable_bwd": (backward_launcher, "msda_bwd_kernel"),
             "sorted_fill": (buckets, "sorted_fill_kernel"),
             "stable_gather": (grad_value, "grad_value_gather_kernel")}

# The mmdet default call (Deformable DETR decoder on a COCO image, D = 32,
# L = K = 4); a variant only swaps the head dim.  Only the strides and the
# constexprs derived from it reach the compiler.  fwd_pairs, the forward of
# large grids, and the stable sort's kernels compile the encoder's call.
SHAPE = PRESETS["decoder"]
PAIRS_SHAPE = PRESETS["encoder"]

# Anchored at the opcode so operands, labels and comments never match;
# Triton's inline asm puts a predicate (@%p1 / @!%p1) in front.
_PTX_OP = r"^\s*(?:@!?%p\d+\s+)?({}\.[\w.]+)"
_PTX_ATOMIC = re.compile(_PTX_OP.format("(?:atom|red)"), re.M)
_PTX_LOAD = re.compile(_PTX_OP.format(r"ld\.global"), re.M)
# tl.exp of fp32: ex2.approx of x * log2(e) (the SOFTMAX forwards only).
_PTX_EXP = re.compile(_PTX_OP.format(r"ex2"), re.M)
# REDG? followed by a dot leaves out REDUX (a warp reduction, not an atomic).
_SASS_ATOMIC = re.compile(r"\b((?:ATOM[GS]?|REDG?)\.[\w.]+)")
_SASS_LOAD = re.compile(r"\b(LDG\.[\w.]+)")
_SASS_STORE = re.compile(r"\b(STG\.[\w.]+)")
# The kernels keep no arrays in local memory, so any STL/LDL is a spill.
_SASS_SPILL = re.compile(r"\b(STL|LDL)\b")
_SASS_REGS = re.compile(r"\bREG:(\d+)")
# The backward waits for the fill before its atomics where it is launched
# with programmatic dependent launch (sm_90+).
_PTX_PDL_WAIT = re.compile(_PTX_OP.format(r"griddepcontrol") + r"\b", re.M)


@dataclasses.dataclass(frozen=True)
class Variant:
    kernel: str  # a KERNELS name
    arch: int  # compute capability x 10: 80, 90
    dtype: str  # value's dtype, a key of DTYPES
    head_dim: int
    fp32_accum: Optional[bool] = None  # bwd: grad_value in an fp32 scratch buffer
    auto: Optional[bool] = None  # bwd: fp32_accum is what the op picks on this arch
    deterministic: bool = False  # bwd: grad_value by DET_KERNELS (fp32_accum unused)
    softmax: bool = False  # attention weights are logits (SOFTMAX; bwd: not deterministic)

    @property
    def accum(self) -> str:
        if self.kernel == "fwd":
            return "-"
        if self.deterministic:
            return "int64 (deterministic)"
        mode = "fp32" if self.fp32_accum else "native"
        return f"{mode} ({'auto' if self.auto else 'forced'})"

    @property
    def shape(self):
        return PAIRS_SHAPE if self.kernel in ("fwd_pairs", *STABLE_KERNELS) else SHAPE

    @classmethod
    def of(cls, row: dict) -> "Variant":
        """The variant a row (compile_variant's, or compile_check.py --json's) is of."""
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls)})


def auto_fp32_accum(dtype: str, arch: int) -> bool:
    """What ``resolve_fp32_grad_accum(value, None)`` picks on a GPU of this
    arch: the op's own rule, asked through a stand-in CUDA value."""
    value = types.SimpleNamespace(dtype=DTYPES[dtype], is_cuda=True, device=torch.device("cuda"))
    with mock.patch.object(torch.cuda, "get_device_capability", return_value=divmod(arch, 10)):
        return resolve_fp32_grad_accum(value, None)


def variants(archs, dtypes, head_dims, kernels=KERNELS, softmax=(False,)) -> list[Variant]:
    """Per (arch, dtype, D) and each of ``softmax``: the forwards; the
    backward with the auto-selected accumulation and the other one forced,
    except for fp32 values, where both modes are the same fp32 kernel; then,
    without softmax (which that backward does not take), the deterministic
    backward (msda_bwd_kernel without grad_value) and each of DET_KERNELS in
    ``kernels``."""
    out = []
    for arch in archs:
        for dtype in dtypes:
            for d in head_dims:
                for fused in softmax:
                    if "fwd" in kernels:
                        out.append(Variant("fwd", arch, dtype, d, softmax=fused))
                    # The launcher sends only even head dims to the pairs kernel.
                    if "fwd_pairs" in kernels and d % 2 == 0:
                        out.append(Variant("fwd_pairs", arch, dtype, d, softmax=fused))
                    if "bwd" in kernels:
                        auto = auto_fp32_accum(dtype, arch)
                        out.append(Variant("bwd", arch, dtype, d, auto, True, softmax=fused))
                        if dtype != "fp32":
                            out.append(Variant("bwd", arch, dtype, d, not auto, False,
                                               softmax=fused))
                if "bwd" in kernels:
                    out.append(Variant("bwd", arch, dtype, d, False, False, True))
                out += [Variant(k, arch, dtype, d, deterministic=True)
                        for k in DET_KERNELS if k in kernels]
    return out


class _Recorder:
    """Stands in for a launcher's kernel: ``kernel[grid](*args, **kwargs)``
    records the call instead of running it."""

    def __init__(self, fn):
        self.fn = fn
        self.call = None

    def __getitem__(self, grid):
        return self._record

    def _record(self, *args, **kwargs):
        self.call = (args, kwargs)


def _recorded_launch(v: Variant):
    """(kernel, args, kwargs) as the launchers pass them for this variant:
    its tile choice, num_warps, argument order and contiguous strides."""
    shape = v.shape
    B, S, Q, M = shape.batch, shape.num_values, shape.num_queries, shape.heads
    L, K, D = len(shape.levels), shape.points, v.head_dim

    def empty(*shape, dtype=DTYPES[v.dtype]):
        return torch.empty(shape, dtype=dtype, device="meta")

    inputs = (empty(B, S, M, D), empty(L, 2, dtype=torch.int64),
              empty(B, Q, M, L, K, 2), empty(B, Q, M, L, K))
    # Every kernel only records its call; as on a GPU of this arch: PDL from
    # sm_90 on, behind the fill kernel.
    recorders = {launched: _Recorder(getattr(*launched).fn) for launched in _LAUNCHED.values()}
    recorder = recorders[_LAUNCHED[v.kernel]]
    with contextlib.ExitStack() as stack:
        for (module, name), r in recorders.items():
            stack.enter_context(mock.patch.object(module, name, r))
        stack.enter_context(mock.patch.object(backward_launcher, "fill_zeros",
                                              lambda t: v.arch >= 90))
        if v.kernel.startswith("fwd"):
            forward_launcher.launch_forward(*inputs, softmax=v.softmax)
        else:
            backward_launcher.launch_backward(empty(B, Q, M * D), *inputs, v.fp32_accum,
                                              v.deterministic, v.softmax)
    if recorder.call is None:
        raise RuntimeError(f"the launcher did not pick {_LAUNCHED[v.kernel][1]} for {v}")
    return (recorder.fn, *recorder.call)


def _compile(fn, args, kwargs, arch: int):
    if not isinstance(fn, JITFunction):
        raise RuntimeError(f"{fn!r} is not a JITFunction (TRITON_INTERPRET=1 when msda_mm was "
                           f"imported?); interpreted kernels cannot be compiled")
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    # JITFunction.run's own specialisation path (private, the same in Triton
    # 3.6 and 3.7), so the signature, constexprs and divisibility attributes
    # are those of a real launch: on an H200 the kernel hashes of real
    # launches and of these sm_90 compiles were found equal.
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound,
                                                          specialization, options)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                          options=options.__dict__)


def _cuobjdump(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([knobs.nvidia.cuobjdump.path, "-sass", "-res-usage", f.name],
                              capture_output=True, text=True, check=True).stdout


def _count(pattern: re.Pattern, text: str) -> dict:
    return dict(collections.Counter(pattern.findall(text)))


def analyse(ptx: str, sass: str) -> dict:
    """Atomics, global loads and stores, registers and spills of one compiled
    kernel.

    The kernels never compare-and-swap on their own, so a CAS is an atomic
    add the hardware lacks, lowered to a load / CAS retry loop."""
    atomics = _count(_PTX_ATOMIC, ptx), _count(_SASS_ATOMIC, sass)
    spills = _count(_SASS_SPILL, sass)
    return dict(
        ptx_atomics=atomics[0], sass_atomics=atomics[1],
        cas_loop=any(".cas" in op.lower() for ops in atomics for op in ops),
        ptx_loads=_count(_PTX_LOAD, ptx), sass_loads=_count(_SASS_LOAD, sass),
        sass_stores=_count(_SASS_STORE, sass),
        regs=int(_SASS_REGS.search(sass).group(1)),
        pdl_waits=sum(op == "griddepcontrol.wait" for op in _PTX_PDL_WAIT.findall(ptx)),
        exps=len(_PTX_EXP.findall(ptx)),
        spill_stores=spills.get("STL", 0), spill_loads=spills.get("LDL", 0),
    )


# What of the PTX is debug information, which moves with every source line:
# .loc/.file directives, comments, $L__tmp labels and the .debug sections.
_PTX_DEBUG_LINE = re.compile(r"^\s*(?:\.loc|\.file|//|\$L__tmp\d+:)")
_PTX_DEBUG_SECTIONS = re.compile(r"^\s*\.section\s+\.debug", re.M)


def code_ptx(ptx: str) -> str:
    """The PTX without its debug information: equal for equal code."""
    ptx = _PTX_DEBUG_SECTIONS.split(ptx, maxsplit=1)[0]
    return "".join(line for line in ptx.splitlines(keepends=True)
                   if not _PTX_DEBUG_LINE.match(line))


def variant_name(v: Variant) -> str:
    """A file name stem for the variant, e.g. fwd-sm90-bf16-d32,
    fwd-sm90-bf16-d32-softmax or bwd-sm90-bf16-d32-native_auto."""
    accum = re.sub(r"\W+", "_", v.accum).strip("_")
    return (f"{v.kernel}-sm{v.arch}-{v.dtype}-d{v.head_dim}" + (f"-{accum}" if accum else "")
            + ("-softmax" if v.softmax else ""))


def compile_variant(v: Variant, dump: Optional[Path] = None) -> dict:
    """The variant's fields plus ``analyse``'s, or ``error`` if it does not
    compile.  Never raises, so one failure does not hide the others.
    ``dump``: a folder to write the variant's code_ptx (.ptx) and SASS
    (.sass) into, to diff two checkouts' code."""
    row = dict(dataclasses.asdict(v), accum=v.accum, triton=triton.__version__)
    start = time.perf_counter()
    try:
        kernel = _compile(*_recorded_launch(v), v.arch)
        sass = _cuobjdump(kernel.asm["cubin"])
        if dump:
            stem = Path(dump) / variant_name(v)
            stem.with_suffix(".ptx").write_text(code_ptx(kernel.asm["ptx"]))
            stem.with_suffix(".sass").write_text(sass)
        row.update(analyse(kernel.asm["ptx"], sass), error=None)
    except Exception as e:  # noqa: BLE001 - reported per variant, the tool exits non-zero
        row["error"] = f"{type(e).__name__}: {e}"
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row
