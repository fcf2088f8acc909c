"""torch's weights_only loading of mmengine checkpoints with msda_mm's
allow-list: a real training checkpoint loads (and fails without msda_mm),
HistoryBuffers keep their statistics, and getattr reaches nothing else."""
import pickle

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer

import msda_mm.engine  # noqa: F401  (registers the allow-list)

from .conftest import run

LOAD = "import sys, torch{}; c = torch.load(sys.argv[1], weights_only=True); print(sorted(c))"


@pytest.mark.slow
def test_a_training_checkpoint_loads_weights_only_with_msda_mm(resumed_run):
    checkpoint = resumed_run[0] / "epoch_2.pth"
    bare = run("-c", LOAD.format(""), checkpoint)
    assert bare.returncode != 0
    assert "Unsupported global: GLOBAL mmengine.logging.history_buffer.HistoryBuffer" in bare.stdout
    done = run("-c", LOAD.format(", msda_mm"), checkpoint)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "['message_hub', 'meta', 'optimizer', 'param_schedulers', 'state_dict']" in done.stdout


def test_history_buffers_load_with_their_statistics(tmp_path):
    buffer = HistoryBuffer()
    for value, count in ((1.5, 1), (2.5, 3)):
        buffer.update(value, count)
    torch.save({"loss": buffer, "lr": np.float64(2e-4)}, tmp_path / "hub.pth")
    loaded = torch.load(tmp_path / "hub.pth", weights_only=True)
    for statistic in ("min", "max", "current", "mean"):
        assert loaded["loss"].statistics(statistic) == buffer.statistics(statistic)
    np.testing.assert_array_equal(loaded["loss"].data[1], [1, 3])
    assert loaded["lr"] == 2e-4


class _Reach:
    """Pickles as getattr(a torch function, '__globals__'): its module's namespace."""

    def __reduce__(self):
        return getattr, (torch._utils._rebuild_tensor_v2, "__globals__")


def test_getattr_reaches_only_history_buffer_statistics(tmp_path):
    torch.save({"x": _Reach()}, tmp_path / "reach.pth")
    with pytest.raises(pickle.UnpicklingError,
                       match=r"getattr\(<function _rebuild_tensor_v2 .*'__globals__'\) is not "
                             r"allowed; only HistoryBuffer's statistics"):
        torch.load(tmp_path / "reach.pth", weights_only=True)


def test_object_arrays_stay_refused(tmp_path):
    torch.save({"x": np.array([print], dtype=object)}, tmp_path / "objects.pth")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "objects.pth", weights_only=True)
