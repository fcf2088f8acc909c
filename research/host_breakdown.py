"""Where the host time of an eager MSDA forward + backward goes
(research/host.py).

    python research/host_breakdown.py [--presets decoder] [--dtypes bf16,fp32]
        [--profile-calls 200] [--torch-profile-calls 50] [--out benchmarks]

For each preset and dtype, the host time of each piece of the call; then,
with --profile-calls N, cProfile of N direct calls of each launcher (the
functions with the most own time); with --torch-profile-calls N,
torch.profiler's CPU events of N eager forward + backward calls, by self
time per call, on every thread (cProfile sees only the calling thread,
and CUDA runs the backward on autograd's own).  Writes
<out>/<device-slug>-host-breakdown.json and prints the tables.  On CPU
(TRITON_INTERPRET=1 for the kernels) the times are the interpreter's.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Runs as `python research/host_breakdown.py` from a checkout, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.op.cli import names  # noqa: E402
from bench.op.presets import PRESETS  # noqa: E402
from bench.op.report import write_results  # noqa: E402
from bench.op.run import DTYPES, preset_inputs  # noqa: E402
from msda_mm.ops.runtime import interpreter_enabled  # noqa: E402
from research.host import host_breakdown, pieces, profile  # noqa: E402

_PROFILED = ("launch_forward", "launch_backward")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", type=names(PRESETS), default=("decoder",))
    parser.add_argument("--dtypes", type=names(DTYPES), default=("bf16", "fp32"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--budget-ms", type=float, default=100.0,
                        help="timing budget per piece (default 100)")
    parser.add_argument("--profile-calls", type=int, default=0,
                        help="cProfile this many direct calls of each launcher (default 0: none)")
    parser.add_argument("--torch-profile-calls", type=int, default=0,
                        help="torch.profiler over this many eager forward + backward calls "
                             "(default 0: none)")
    parser.add_argument("--top", type=int, default=15, help="profile rows shown (default 15)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks"))
    args = parser.parse_args(argv)
    if min(args.profile_calls, args.torch_profile_calls) < 0 or args.top < 1:
        parser.error("--profile-calls and --torch-profile-calls must be >= 0, --top >= 1")
    if args.device == "cpu" and not interpreter_enabled():
        # The op would run the PyTorch reference and the launchers fail.
        parser.error("--device cpu needs TRITON_INTERPRET=1 (the kernels in Triton's "
                     "interpreter)")
    return args


def torch_profile(fn, calls: int, top: int, device: torch.device) -> list[dict]:
    """The ``top`` host events of ``calls`` calls of ``fn`` by self time,
    each as {name, calls, self_us, total_us} per call of ``fn``.  On CUDA
    with the CUDA activity too, so that the runtime's and driver's launch
    calls are events of their own, not self time of the op around them."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    fn()
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return [dict(name=e.key, calls=e.count / calls, self_us=e.self_cpu_time_total / calls,
                 total_us=e.cpu_time_total / calls) for e in events[:top]]


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    cells = []
    for name, dname, inputs in preset_inputs(args.presets, args.dtypes, device):
        calls = pieces(inputs)
        times = host_breakdown(inputs, calls, args.budget_ms)
        print(f"\n{name} {dname}: host us per call")
        for piece, us in times.items():
            print(f"  {piece:34s} {us:9.1f}")
        cell = dict(preset=name, dtype=dname, host_us=times)
        if args.profile_calls:
            cell["profiles"] = {p: profile(calls[p], args.profile_calls, args.top)
                                for p in _PROFILED}
            for piece, text in cell["profiles"].items():
                print(f"\n{name} {dname}: cProfile of {args.profile_calls} x {piece}\n{text}")
        if args.torch_profile_calls:
            rows = torch_profile(calls["op forward + autograd.grad"],
                                 args.torch_profile_calls, args.top, device)
            cell["torch_profile"] = rows
            print(f"\n{name} {dname}: torch.profiler, per forward + backward "
                  f"({args.torch_profile_calls} calls)")
            for row in rows:
                print(f"  {row['name'][:48]:48s} {row['calls']:5.1f} x  self {row['self_us']:8.1f}"
                      f" us  total {row['total_us']:8.1f} us")
        cells.append(cell)
    write_results(args.out, device, "host-breakdown", cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
