"""deformops' multi-scale deformable attention (PyPI ``deformops``) as the
benchmark calls it, and why it cannot run here.

deformops is optional (``pip install deformops``, or this checkout's
``deformops`` extra): where it does not import, its rows are n/a with that
install line, and the other implementations run.

Which deformops function the rows call is decided in one place,
:func:`deformops_msda_function`.  deformops picks its MSDA kernel itself
(eager, CUDA or Triton) by device, GPU architecture and training precision;
the benchmark sets no backend, so a row times whichever kernel deformops
picks for the call.
"""
from __future__ import annotations

import importlib
from typing import Callable, Optional

import torch

PACKAGE = "deformops"
INSTALL = "pip install deformops"
# The call the rows make, in mmcv's argument order and layouts.
EXPECTED_CALL = ("deformops.deform2d_multiscale(value (B, S, M, D), spatial_shapes (L, 2), "
                 "level_start_index (L,), sampling_locations (B, Q, M, L, K, 2), "
                 "attention_weights (B, Q, M, L, K)) -> (B, Q, M * D)")

MSDAFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                        torch.Tensor]


def deformops_missing() -> Optional[str]:
    """Why deformops cannot be imported here (naming the package and the
    install line), or None."""
    try:
        importlib.import_module(PACKAGE)
    except ModuleNotFoundError as error:
        if error.name == PACKAGE:
            return f"PyPI package deformops is not installed: {INSTALL}"
        return f"deformops does not import ({error}): {INSTALL}"
    except (ImportError, OSError) as error:  # a build for another torch, a missing library
        return f"deformops does not import ({type(error).__name__}: {error}): {INSTALL}"
    return None


def deformops_msda_function() -> MSDAFunction:
    """deformops' multi-scale deformable attention: the package's top-level
    ``deform2d_multiscale`` (its name in deformops 2.0's public source; 3.0
    describes the same three operators), called positionally as
    :data:`EXPECTED_CALL` says, spatial_shapes as (H, W) and locations as
    (x, y) in [0, 1], with deformops' default ``im2col_step``.

    Raises AttributeError naming the expected call where the installed
    deformops has no such function (then this function is the one place
    to adapt).
    """
    deformops = importlib.import_module(PACKAGE)
    try:
        return deformops.deform2d_multiscale
    except AttributeError:
        version = getattr(deformops, "__version__", "of unknown version")
        raise AttributeError(
            f"deformops {version} has no deform2d_multiscale: the benchmark calls "
            f"{EXPECTED_CALL}; adapt bench/op/deformops_msda.py") from None
