"""Triton launches without Triton's per-launch argument binding.

``JITFunction.run`` binds and specialises every argument on every launch
(the backward's 45 arguments: 23 ``native_specialize_impl`` calls, a cache
key, a check of the kernel's globals) before it reaches the compiled
kernel's launcher: on the H200 box that was about half of each launcher's
host time (cProfile; docs/design.md).  ``FastLaunch`` keeps the compiled kernel
that a first, ordinary launch returns, under a key that holds everything
Triton specialises on (each tensor's dtype and 16-byte alignment, the exact
value of every other argument, the constexprs and options, the device), and
launches it directly through ``CompiledKernel[grid]`` when the key repeats.
A new key takes the ordinary path, so a shape, stride or alignment never
seen before compiles (or finds Triton's own cache) as always.  In the
interpreter (``TRITON_INTERPRET=1``) a launch returns no compiled kernel and
every launch takes the ordinary path.
"""
from __future__ import annotations

from triton.compiler import CompiledKernel

# What an ordinary launch must return for it to be kept (a test hook).
COMPILED = (CompiledKernel,)


def specialisation_key(args: tuple, kwargs: dict, pointers: int) -> tuple:
    """Everything Triton's launch specialises on, and more: the first
    argument's device; per pointer argument (the first ``pointers``: tensors
    or None) the tensor's dtype and whether its data pointer is 16-byte
    aligned; every other positional argument's exact value (Triton looks only
    at some properties of an int, such as being 1 or a multiple of 16: equal
    values have equal properties whatever the Triton version); the keyword
    arguments (constexprs and options) in the order given.  What the key
    leaves out, the launchers keep fixed: the type of each argument (no bool
    where an int was, no float), and every tensor on the first one's device.
    Split so, the backward's 45 arguments take about a quarter of the time
    of a type and a test per argument (docs/design.md)."""
    return (args[0].get_device(),
            tuple([None if a is None else (a.dtype, not a.data_ptr() & 15)
                   for a in args[:pointers]]),
            args[pointers:], tuple(kwargs.items()))


class FastLaunch:
    """``FastLaunch(jit_fn)[grid](*args, **kwargs)`` launches like
    ``jit_fn[grid](*args, **kwargs)``.

    What it assumes of its callers (the launchers): the grid is a
    tuple; constexprs and options come as keyword arguments, every
    constexpr given (none left to its default), everything else
    positionally; launches run on the tensors' device (the launchers'
    device guard); Triton's process-wide switches that its cache key holds
    (``TRITON_DEBUG``, the instrumentation mode) do not change between
    launches.  The fast path skips what JITFunction.run does besides
    binding: pre-run hooks (msda_mm's kernels have none) and its check that
    the kernel's globals have not changed; launch hooks still run."""

    # Keys kept per kernel; past this many (shapes that keep changing, such
    # as an encoder fed ever other image sizes) the cache starts over.
    MAX_KERNELS = 1024

    def __init__(self, fn):
        self.fn = fn
        self.kept: dict = {}  # key -> (compiled kernel, constexpr names)
        # The leading pointer parameters: msda_mm's kernels name them *ptr.
        self.pointers = next((i for i, name in enumerate(fn.arg_names)
                              if not name.endswith("ptr")), len(fn.arg_names))

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def constexpr_names(self, args: tuple) -> tuple:
        """The parameters after the positional ``args``: the constexprs."""
        return tuple(self.fn.arg_names[len(args):])

    def full_args(self, args: tuple, kwargs: dict, names: tuple | None = None) -> tuple:
        """Every parameter's value in the kernel's order, constexprs
        included, as JITFunction.run hands them to the compiled kernel;
        options (num_warps, launch_pdl) are no parameters.  ``names``: the
        constexpr_names of ``args``, where already known."""
        names = self.constexpr_names(args) if names is None else names
        return (*args, *[kwargs[name] for name in names])

    def _launch(self, grid, args: tuple, kwargs: dict) -> None:
        key = specialisation_key(args, kwargs, self.pointers)
        kept = self.kept.get(key)
        if kept is None:
            kernel = self.fn[grid](*args, **kwargs)
            if isinstance(kernel, COMPILED):
                if len(self.kept) >= self.MAX_KERNELS:
                    self.kept.clear()
                # The constexprs' names are fixed per key: kept, not sliced each launch.
                self.kept[key] = (kernel, self.constexpr_names(args))
            return
        kernel, names = kept
        # JITFunction.run pads the grid to three dimensions; the compiled
        # kernel's runner reads grid[0], grid[1] and grid[2].
        kernel[(*grid, 1, 1)[:3]](*self.full_args(args, kwargs, names))
