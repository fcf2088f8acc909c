"""FastLaunch: a repeat launch goes straight to the compiled kernel with
every parameter in order; anything Triton specialises on that changes
takes the ordinary path again (CPU: a stand-in for the compiled kernel, and
the real kernels in the interpreter, which never return one)."""
import pytest
import torch

from msda_mm.ops import fast_launch, kernels, launch
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
    monkeypatch.setattr(fast_launch, "_COMPILED", (_Compiled,))
    return _JitFn()


def test_a_repeat_launch_passes_every_parameter_in_order(jit_fn):
    fast = FastLaunch(jit_fn)
    t = torch.zeros(8)
    fast[(2,)](t, 8, BLOCK=4, PDL=False, num_warps=4)
    fast[(3,)](t, 8, BLOCK=4, PDL=False, num_warps=4)
    assert jit_fn.calls == [("run", (2,), (t, 8), dict(BLOCK=4, PDL=False, num_warps=4)),
                            ("compiled", (3,), (t, 8, 4, False))]  # options are no parameters


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
    assert specialisation_key((a, 3), {}) == specialisation_key((b, 3), {})
    assert specialisation_key((a, 3), {}) == specialisation_key((a[4:], 3), {})  # 16 bytes on
    assert specialisation_key((a, 3), {}) != specialisation_key((a[1:], 3), {})
    monkeypatch.setattr(FastLaunch, "MAX_KERNELS", 2)
    fast = FastLaunch(jit_fn)
    for n in (1, 2, 3):  # the third key starts the cache over
        fast[(1,)](a, n, BLOCK=4, PDL=False)
    assert len(fast._kernels) == 1
    fast[(1,)](a, 3, BLOCK=4, PDL=False)
    assert jit_fn.calls[-1][0] == "compiled"


def test_interpreted_kernels_are_never_kept():
    # The interpreter returns no compiled kernel: every launch runs it.
    fast = FastLaunch(kernels.zero_fill_kernel)
    words = torch.full((40,), -1, dtype=torch.int32)
    for _ in range(2):
        fast[(2,)](words, 40, BLOCK=16, PDL=False, num_warps=1)
        assert not words.any()
        words.fill_(-1)
    assert fast._kernels == {}
    assert isinstance(launch.msda_bwd_kernel, FastLaunch)
