"""What mmengine's checkpoints hold beyond tensors, allowed for torch.load's
``weights_only=True`` (the default from torch 2.6), so that mmengine's own
loader reads them and nothing else is admitted.

The list is what a checkpoint of a training run carries (its test saves one
and loads it with ``weights_only=True``): the message hub's HistoryBuffers,
their numpy arrays (numpy's reconstructors, numeric dtypes) and statistics
methods.  torch allows OrderedDict, Counter (MultiStepLR's milestones) and
``_codecs.encode`` (numpy's bytes) itself.
"""
from __future__ import annotations

import pickle

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

# The statistics mmengine registers on every HistoryBuffer; its pickle names
# each one as getattr(HistoryBuffer, name).
HISTORY_STATISTICS = frozenset({"min", "max", "current", "mean"})


def history_buffer_statistic(owner, name: str):
    """``getattr`` as the weights-only unpickler may call it: a HistoryBuffer
    statistic and nothing else (a free getattr would reach any module)."""
    if owner is HistoryBuffer and name in HISTORY_STATISTICS:
        return getattr(HistoryBuffer, name)
    raise pickle.UnpicklingError(
        f"weights_only load: getattr({owner!r}, {name!r}) is not allowed; only HistoryBuffer's "
        f"statistics ({', '.join(sorted(HISTORY_STATISTICS))})")


def _numpy_globals() -> list:
    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    # numpy 1 pickles numpy.core.*, numpy 2 numpy._core.*: both names load.
    named = [(getattr(multiarray, fn), f"{module}.{fn}")
             for module in ("numpy.core.multiarray", "numpy._core.multiarray")
             for fn in ("_reconstruct", "scalar")]
    # Numeric and bool dtypes only: no object, string, void or datetime arrays.
    codes = "?" + np.typecodes["AllInteger"] + np.typecodes["AllFloat"]
    dtypes = sorted({type(np.dtype(code)) for code in codes}, key=lambda t: t.__name__)
    return [np.ndarray, np.dtype, *dtypes, *named]


def allow_mmengine_checkpoints() -> None:
    """Register the list with torch (torch >= 2.6: before it, torch.load
    reads everything unless told ``weights_only=True``, and its allow-list
    takes no renamed entries)."""
    if tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 6):
        return
    torch.serialization.add_safe_globals([
        HistoryBuffer, (history_buffer_statistic, "builtins.getattr"), *_numpy_globals()])
