"""FastLaunch: a repeat launch goes straight to the compiled kernel with
every parameter in order; anything Triton specialises on that changes
takes the ordinary path again (CPU: a stand-in for the compiled kernel, and
the real kernels in the interpreter, which never return one)."""
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from triton.compiler import CompiledKernel
from triton.compiler import compiler as triton_compiler

from msda_mm.ops import fast_launch
from msda_mm.ops.backward import launcher as backward_launcher
from msda_mm.ops.backward.kernels import zero_fill_kernel
from msda_mm.ops.fast_launch import FastLaunch, specialisation_key


class _Compiled:
    def __init__(self, calls):
        self.calls = calls

    def __getitem__(self, grid):
        return lambda *args: self.calls.append(("compiled", grid, args))


class _JitFn:
    """A stand-in JITFunction: kernel(ptr, n, BLOCK: constexpr, PDL: constexpr)."""
    arg_names = ["ptr", "n", "BLOCK", "PDL"]

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.calls.append(("run", grid, args, kwargs))
            return _Compiled(self.calls)
        return run


@pytest.fixture
def jit_fn(monkeypatch):
    monkeypatch.setattr(fast_launch, "COMPILED", (_Compiled,))
    return _JitFn()


def test_a_repeat_launch_passes_every_parameter_in_order(jit_fn):
    fast = FastLaunch(jit_fn)
    t = torch.zeros(8)
    fast[(2,)](t, 8, BLOCK=4, PDL=False, num_warps=4)
    fast[(3,)](t, 8, BLOCK=4, PDL=False, num_warps=4)
    assert jit_fn.calls == [("run", (2,), (t, 8), dict(BLOCK=4, PDL=False, num_warps=4)),
                            ("compiled", (3, 1, 1), (t, 8, 4, False))]  # options: no parameters


@pytest.mark.parametrize("change", ["int", "constexpr", "option", "dtype", "alignment"])
def test_whatever_triton_specialises_on_takes_the_ordinary_path(jit_fn, change):
    fast = FastLaunch(jit_fn)
    base = torch.zeros(16)
    args, kwargs = [base, 16], dict(BLOCK=4, PDL=False, num_warps=4)
    fast[(1,)](*args, **kwargs)
    if change == "int":
        args[1] = 15
    elif change == "constexpr":
        kwargs["BLOCK"] = 8
    elif change == "option":
        kwargs["num_warps"] = 8
    elif change == "dtype":
        args[0] = base.double()
    else:
        args[0] = base[1:]  # 4 bytes past a 16-byte aligned start
    fast[(1,)](*args, **kwargs)
    assert [c[0] for c in jit_fn.calls] == ["run", "run"]
    fast[(1,)](*args, **kwargs)
    assert [c[0] for c in jit_fn.calls] == ["run", "run", "compiled"]


def test_equal_properties_share_a_key_and_the_cache_is_bounded(jit_fn, monkeypatch):
    a, b = torch.zeros(16), torch.ones(16)
    assert specialisation_key((a, 3), {}, 1) == specialisation_key((b, 3), {}, 1)
    assert specialisation_key((a, 3), {}, 1) == specialisation_key((a[4:], 3), {}, 1)  # 16 bytes on
    assert specialisation_key((a, 3), {}, 1) != specialisation_key((a[1:], 3), {}, 1)
    monkeypatch.setattr(FastLaunch, "MAX_KERNELS", 2)
    fast = FastLaunch(jit_fn)
    for n in (1, 2, 3):  # the third key starts the cache over
        fast[(1,)](a, n, BLOCK=4, PDL=False)
    assert len(fast.kept) == 1
    fast[(1,)](a, 3, BLOCK=4, PDL=False)
    assert jit_fn.calls[-1][0] == "compiled"


def test_interpreted_kernels_are_never_kept():
    # The interpreter returns no compiled kernel: every launch runs it.
    fast = FastLaunch(zero_fill_kernel)
    words = torch.full((40,), -1, dtype=torch.int32)
    for _ in range(2):
        fast[(2,)](words, 40, BLOCK=16, PDL=False, num_warps=1)
        assert not words.any()
        words.fill_(-1)
    assert fast.kept == {}
    assert isinstance(backward_launcher.msda_bwd_kernel, FastLaunch)


def test_triton_compiled_kernels_runner_gets_a_whole_grid(monkeypatch):
    # Triton's own CompiledKernel.__getitem__ runner (with its launcher and
    # the driver stood in): it indexes grid[0..2], so a 1-D grid must come
    # padded, and the launcher gets every parameter after its fixed leading
    # arguments (grid, stream, function, metadata, launch metadata, hooks).
    launched = []
    compiled = CompiledKernel.__new__(CompiledKernel)
    compiled._run, compiled.function, compiled.packed_metadata = (
        lambda *a: launched.append(a), "function", "metadata")
    monkeypatch.setattr(CompiledKernel, "_init_handles", lambda self: None)
    monkeypatch.setattr(triton_compiler.knobs.runtime, "launch_enter_hook", None)
    driver = types.SimpleNamespace(active=types.SimpleNamespace(
        get_current_device=lambda: 0, get_current_stream=lambda device: "stream"))
    monkeypatch.setattr(triton_compiler, "driver", driver)

    class JitFn(_JitFn):
        def __getitem__(self, grid):
            return lambda *args, **kwargs: compiled

    fast = FastLaunch(JitFn())
    t = torch.zeros(8)
    for _ in range(2):
        fast[(5,)](t, 8, BLOCK=4, PDL=True, num_warps=4)
    (call,) = launched
    assert call[:5] == (5, 1, 1, "stream", "function") and call[-4:] == (t, 8, 4, True)


def test_full_args_are_what_triton_binds_for_every_launch(tmp_path):
    # JITFunction.run hands the compiled kernel every bound parameter in
    # order; FastLaunch must hand the same for each launch the launcher
    # makes (recorded on meta tensors, as research/compile_check.py does).  A
    # subprocess: the interpreter, on in this process, has no binder.
    script = """
import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import create_function_from_signature
from msda_mm.ops.backward.kernels import zero_fill_kernel
from research import codegen as cc
from msda_mm.ops.fast_launch import FastLaunch
backend = make_backend(GPUTarget("cuda", 90, 32))
def same(a, b):
    return a is b if isinstance(a, torch.Tensor) else a == b
calls = [cc._recorded_launch(v) for v in cc.variants([90], ["bf16", "fp32"], [32])]
words = torch.empty(10, dtype=torch.int32, device="meta")
calls.append((zero_fill_kernel, (words, 10), dict(PDL=True, BLOCK=4096, num_warps=4)))
for fn, args, kwargs in calls:
    bound = create_function_from_signature(fn.signature, fn.params, backend)(*args, **kwargs)[0]
    mine = FastLaunch(fn).full_args(args, kwargs)
    assert len(mine) == len(bound) and all(map(same, mine, bound.values())), fn
print(len(calls))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) >= 6
