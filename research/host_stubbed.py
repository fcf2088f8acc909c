"""The Python host work of one eager MSDA forward + backward with the device
work taken out (CPU, launches stubbed): msda_mm's op beside the wrapper of
roulbac/msda-triton (the Triton op msda_mm started from), in one process, in
alternating order.

    python research/host_stubbed.py [--presets decoder,dino_decoder] [--reps 2000]
        [--peers .peers] [--profile msda_mm] [--profile-calls 1000] [--top 25]

Each call is what the benchmark's ``host_fwdbwd_us`` times (bench/op/cell.py):
the implementation as bench/op/impls.py binds it, then ``torch.autograd.grad``
of its output, here on fp32 CPU tensors of the preset's B, Q, M, D, L and K
with one pixel a level (the host's work on this path does not depend on S,
and a real S would make grad_value's fill, device work on a GPU, the
measurement).  Inside ``cuda_path()`` the calls take their CUDA branches and
launch nothing:

- every Triton kernel of both (msda_mm's FastLaunch kernels, the Triton
  kernels of the peer's module) is a ``NoLaunch``, which returns at once:
  the outputs stay as allocated;
- ``Tensor.is_cuda`` reads True, so that msda_mm's ``_use_triton`` and
  device guard and msda-triton's CUDA-only check take the CUDA branch;
- ``torch.cuda.current_device()`` returns the tensors' device index: the
  device guard finds them on the current device, as on a one-GPU machine;
- msda_mm's ``check_levels`` returns at once, as it does for CUDA tensors
  (on the CPU it reads the level values);
- TRITON_INTERPRET is 0.

What a GPU adds is not here: the launches themselves (FastLaunch against
Triton's own launch path and autotuner for msda-triton), the CUDA caching
allocator and fill launches in place of CPU allocations and fills, CUDA's
checks of the device (capability, PDL), and autograd's device thread, where
a CUDA backward's Python runs about 2x slower (docs/design.md).  The GPU
figure is tools/benchmark.py's host column.

Times: CPU time of the calling thread (``time.thread_time``: the time other
processes hold the core is left out), median and 10th percentile of
``--reps`` calls of each; the ratio is the median over rounds of msda_mm's
time over the peer's in the same round.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
from pathlib import Path
from typing import Callable, Optional
from unittest import mock

# Runs as `python research/host_stubbed.py` from a checkout, installed or not.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from triton.runtime.jit import KernelInterface  # noqa: E402

from bench.op.cli import names  # noqa: E402
from bench.op.inputs import MSDAInputs, make_inputs  # noqa: E402
from bench.op.peers import PEERS, peer_function, peer_unavailable  # noqa: E402
from bench.op.presets import PRESETS  # noqa: E402
from msda_mm.ops import op as msda_op  # noqa: E402
from research.host import (  # noqa: E402
    NoLaunch,
    alternating_times_us,
    forward_backward,
    no_launches,
    paired_ratio,
    profile,
    tenth,
)

PEER = PEERS["msda_triton"]
IMPLS = ("msda_mm", PEER.impl)


def stub_inputs(preset: str) -> MSDAInputs:
    """fp32 CPU inputs of ``preset``'s B, Q, M, D, L and K, one pixel a level."""
    p = PRESETS[preset]
    return make_inputs(dataclasses.replace(p, levels=((1, 1),) * len(p.levels),
                                           queries=p.num_queries), "uniform", seed=0)


def load_peer(folder: Path) -> tuple[Optional[Callable], Optional[str]]:
    """(msda-triton's function, None) from the package in ``folder``, or
    (None, why not)."""
    sys.path.insert(0, str(folder))
    try:
        # The peer refuses CPU tensors, which cuda_path makes it take.
        missing = peer_unavailable(PEER, torch.device("cuda"))
        return (None, missing) if missing else (peer_function(PEER), None)
    finally:
        sys.path.remove(str(folder))


def _kernels_of(fn: Callable) -> list[tuple[object, str]]:
    """(module, name) of every Triton kernel in the module that defines ``fn``."""
    module = sys.modules[fn.__module__]
    return [(module, name) for name, obj in vars(module).items()
            if isinstance(obj, KernelInterface)]


@contextlib.contextmanager
def cuda_path(peer_fn: Optional[Callable] = None):
    """Inside this block msda_mm's op (and ``peer_fn``'s module) take their
    CUDA branches on CPU tensors and launch no kernel (the module docstring
    says what is faked and why)."""
    is_cuda = torch._C.TensorBase.is_cuda
    with contextlib.ExitStack() as stack:
        stack.enter_context(no_launches())
        for module, name in _kernels_of(peer_fn) if peer_fn else ():
            stack.enter_context(mock.patch.object(module, name, NoLaunch()))
        stack.enter_context(mock.patch.object(
            torch.Tensor, "is_cuda", property(lambda t: t.is_cpu or is_cuda.__get__(t))))
        stack.enter_context(mock.patch.object(torch.cuda, "current_device", lambda: None))
        stack.enter_context(mock.patch.object(msda_op, "check_levels", lambda *args: None))
        stack.enter_context(mock.patch.dict(os.environ, {"TRITON_INTERPRET": "0"}))
        yield


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", type=names(PRESETS), default=("decoder", "dino_decoder"))
    parser.add_argument("--reps", type=int, default=2000, help="calls of each (default 2000)")
    parser.add_argument("--peers", type=Path, default=ROOT / ".peers",
                        help=f"the folder holding the {PEER.module} package (default .peers); "
                             "without it only msda_mm is timed")
    parser.add_argument("--profile", choices=IMPLS, action="append", default=[],
                        help="cProfile this implementation's calls too (repeatable)")
    parser.add_argument("--profile-calls", type=int, default=1000,
                        help="calls profiled (default 1000)")
    parser.add_argument("--top", type=int, default=25, help="profile rows shown (default 25)")
    args = parser.parse_args(argv)
    if min(args.reps, args.profile_calls, args.top) < 1:
        parser.error("--reps, --profile-calls and --top must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    peer_fn, missing = load_peer(args.peers)
    impls = IMPLS if peer_fn else IMPLS[:1]
    if missing:
        print(f"n/a   {PEER.impl}: {missing}")
    print(f"{'preset':14s}" + "".join(f"{impl + ' us (p10)':>26s}" for impl in impls)
          + ("  msda_mm / peer" if peer_fn else ""))
    with cuda_path(peer_fn):
        for preset in args.presets:
            inputs = stub_inputs(preset)
            calls = {impl: forward_backward(impl, inputs) for impl in impls}
            times = alternating_times_us(calls, args.reps)
            row = "".join(f"{statistics.median(times[impl]):.1f} ({tenth(times[impl]):.1f})"
                          .rjust(26) for impl in impls)
            if peer_fn:
                row += f"{paired_ratio(times[IMPLS[0]], times[IMPLS[1]]):16.3f}"
            print(f"{preset:14s}{row}")
            for impl in args.profile:
                if impl in calls:
                    print(f"\n{preset} {impl}: cProfile of {args.profile_calls} calls\n"
                          + profile(calls[impl], args.profile_calls, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
