"""Resuming the CPU demo as a user does: tools/train.py killed in epoch 2
keeps epoch 1's checkpoint and --resume continues from it; mmdet's own
train.py --resume (the config's VerifiedCheckpointHook) passes over a
damaged latest checkpoint, saying so; and a resume with nothing to resume
stops, naming the work dir, instead of training from scratch."""
import os

import pytest

from .conftest import ROOT, TWO_EPOCHS, copy_run, mmdet_tool, run


@pytest.mark.slow
def test_a_run_killed_in_its_second_epoch_keeps_the_first(killed_run):
    files = sorted(p.name for p in killed_run.iterdir() if p.is_file())
    assert files == ["epoch_1.pth", "epoch_1.pth.sha256", "last_checkpoint", "tiny_demo.py"]
    assert (killed_run / "last_checkpoint").read_text() == str(killed_run / "epoch_1.pth")


@pytest.mark.slow
def test_resume_continues_from_the_last_epoch_saved(resumed_run):
    work_dir, log = resumed_run
    assert f"Load checkpoint from {work_dir / 'epoch_1.pth'}" in log
    assert "resumed epoch: 1, iter: 4" in log
    assert "Epoch(train) [1]" not in log and "Epoch(train) [2][4/4]" in log
    assert (work_dir / "epoch_2.pth").is_file() and (work_dir / "epoch_2.pth.sha256").is_file()


@pytest.mark.slow
def test_mmdet_resume_passes_over_a_damaged_latest_checkpoint(resumed_run, tiny_demo, tmp_path):
    work_dir = copy_run(resumed_run[0], tmp_path / "work")
    latest = work_dir / "epoch_2.pth"
    os.truncate(latest, latest.stat().st_size // 2)
    done = run(mmdet_tool("train.py"), tiny_demo, "--work-dir", work_dir, "--resume",
               *TWO_EPOCHS)
    assert done.returncode == 0, done.stdout[-4000:]
    assert (f"Resuming from {work_dir / 'epoch_1.pth'}, the newest whole checkpoint: passed "
            f"over {latest} (its sha256 ") in done.stdout
    assert "resumed epoch: 1, iter: 4" in done.stdout and "Epoch(train) [2][4/4]" in done.stdout


@pytest.mark.slow
def test_resume_with_nothing_to_resume_stops_naming_the_work_dir(tiny_demo, tmp_path):
    done = run(ROOT / "tools/train.py", tiny_demo, "--work-dir", tmp_path, "--resume")
    assert done.returncode != 0
    assert f"FileNotFoundError: resume: nothing to resume in {tmp_path} " in done.stdout
    assert "--start-if-nothing-to-resume" in done.stdout and "Epoch(train)" not in done.stdout
