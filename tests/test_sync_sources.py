"""bench.step.syncs: counting PyTorch's sync-debug warnings by the Python
frame that made them (CPU: the warnings are raised by hand; the GPU test
makes real ones)."""
import warnings
from collections import Counter

import pytest
import torch

from bench.step import syncs


def _waits_twice():
    warnings.warn(f"{syncs.SYNC_WARNING}, but the sync debug mode is set to warn", stacklevel=1)
    warnings.warn(f"{syncs.SYNC_WARNING}, but the sync debug mode is set to warn", stacklevel=1)


def test_each_sync_warning_is_counted_at_its_caller_and_others_still_shown(recwarn):
    with syncs.counting_sync_warnings() as counts:
        for _ in range(3):  # Python would show a warning once per place
            _waits_twice()
        warnings.warn("an unrelated warning", stacklevel=1)
    # Two lines of _waits_twice, three waits each.
    assert sorted(counts.values()) == [3, 3], counts
    assert all("test_sync_sources.py(" in f and f.endswith("): _waits_twice") for f in counts)
    assert [str(w.message) for w in recwarn] == ["an unrelated warning"]


def test_frames_inside_torch_are_skipped():
    stack = [syncs.traceback.FrameSummary("/x/site-packages/mmdet/models/head.py", 388, "loss"),
             syncs.traceback.FrameSummary("/x/site-packages/torch/_tensor.py", 12, "item"),
             syncs.traceback.FrameSummary("/usr/lib/python3.12/warnings.py", 5, "_showwarnmsg"),
             syncs.traceback.FrameSummary("/usr/lib/python3.14/_py_warnings.py", 9, "_showwarnmsg")]
    assert syncs.innermost_caller(stack) == "mmdet/models/head.py(388): loss"
    assert syncs.innermost_caller(stack[1:]) == syncs.NO_FRAME


def test_off_cuda_nothing_is_counted():
    with syncs.counted_syncs(torch.device("cpu")) as counts:
        torch.ones(3).nonzero()
    assert counts == Counter()


@pytest.mark.gpu
def test_item_and_nonzero_on_cuda_are_counted_where_called():
    x = torch.ones(4, device="cuda")

    def waits():
        x.sum().item()
        x.nonzero()

    with syncs.counted_syncs(x.device) as counts:
        waits()
        torch.ones(4, device="cuda").add_(1)  # no wait
    assert sum(counts.values()) >= 2
    assert all(frame.endswith("): waits") for frame in counts), counts
    assert torch.cuda.get_sync_debug_mode() == 0  # restored
