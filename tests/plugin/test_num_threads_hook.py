"""NumThreadsHook: a run on the configured intra-op thread count, the count
found before it restored after it; the CPU demo runs on one thread."""
from pathlib import Path

import pytest
import torch
from mmdet.registry import HOOKS
from mmengine.config import Config
from mmengine.registry import DefaultScope

from msda_mm.engine import NumThreadsHook

DEMO = Path(__file__).resolve().parents[2] / "configs/synthetic/dino_tiny_cpu.py"


def test_run_takes_the_threads_and_gives_them_back():
    torch.set_num_threads(2)  # the plugin conftest's fixture restores its own count
    hook = NumThreadsHook(num_threads=1)
    hook.before_run(runner=None)
    assert torch.get_num_threads() == 1
    hook.after_run(runner=None)
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (1.5, TypeError), (True, TypeError)])
def test_bad_thread_counts_raise(bad, exc):
    with pytest.raises(exc, match="NumThreadsHook: num_threads must be"):
        NumThreadsHook(num_threads=bad)


def test_demo_config_runs_on_one_thread():
    """Guards: the demo ran on one thread per core, so its AP line changed
    with the machine's core count (AP 0.049 on two threads, 0.043 on one)
    and a busy machine stalled it at OpenMP's barriers (58 minutes)."""
    hooks = Config.fromfile(str(DEMO)).custom_hooks
    with DefaultScope.overwrite_default_scope("mmdet"):
        built = [HOOKS.build(h) for h in hooks]
    assert [h.num_threads for h in built if isinstance(h, NumThreadsHook)] == [1]
