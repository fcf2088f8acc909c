"""mmdet's standard paths on mmcv-lite and torch >= 2.6, run as a user runs
them: mmdet's tools/test.py through ``msda-mm-test`` (msda_mm.mmdet_tools),
and ``Runner.test()`` with ``load_from`` from a script whose config only
names msda_mm in custom_imports, loading with torch's weights_only default
and refusing a damaged checkpoint by name.  (mmdet's train.py and --resume:
test_resume.py.)"""
import shutil

import pytest

from .conftest import AP_LINE, run

RUN_TEST = "from msda_mm.mmdet_tools import run_test; run_test()"
RUNNER_TEST = """
import sys
from mmengine.config import Config
from mmengine.runner import Runner
cfg = Config.fromfile(sys.argv[1])
cfg.work_dir, cfg.load_from = sys.argv[2], sys.argv[3]
Runner.from_cfg(cfg).test()
"""


@pytest.mark.slow
def test_mmdet_test_py_runs_as_msda_mm_test(resumed_run, tiny_demo, tmp_path):
    checkpoint = resumed_run[0] / "epoch_2.pth"
    done = run("-c", RUN_TEST, tiny_demo, checkpoint, "--work-dir", tmp_path)
    assert done.returncode == 0, done.stdout[-4000:]
    assert f"Load checkpoint from {checkpoint}" in done.stdout and AP_LINE in done.stdout


@pytest.mark.slow
def test_runner_test_loads_load_from_and_refuses_a_damaged_one(resumed_run, tiny_demo, tmp_path):
    work_dir = resumed_run[0]
    done = run("-c", RUNNER_TEST, tiny_demo, tmp_path / "good", work_dir / "epoch_2.pth")
    assert done.returncode == 0, done.stdout[-4000:]
    assert AP_LINE in done.stdout

    copies = tmp_path / "copies"
    shutil.copytree(work_dir, copies, ignore=shutil.ignore_patterns("2*", "*.py"))
    damaged = copies / "epoch_2.pth"
    with open(damaged, "r+b") as f:
        f.seek(damaged.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))
    done = run("-c", RUNNER_TEST, tiny_demo, tmp_path / "bad", damaged)
    assert done.returncode != 0 and AP_LINE not in done.stdout
    assert (f"DamagedCheckpointError: load_from {damaged}: damaged checkpoint, its sha256 "
            in done.stdout)
    assert f"the newest whole checkpoint beside it is {copies / 'epoch_1.pth'}" in done.stdout
