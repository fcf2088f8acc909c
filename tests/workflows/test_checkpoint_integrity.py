"""msda_mm.engine's checkpoint checks on small torch.save files: what counts
as whole (a matching sha256, else the zip's CRC-32s), what the verified
backend writes, and what VerifiedCheckpointHook picks before the Runner
loads (a stand-in Runner: the hook reads only what load_or_resume reads)."""
import io
import os
import shutil
from types import SimpleNamespace

import pytest
import torch

from msda_mm.engine import (
    DamagedCheckpointError,
    VerifiedCheckpointHook,
    checkpoint_problem,
    verified_backend,
)
from msda_mm.engine.checkpoint_integrity import digest_path
from msda_mm.engine.verified_backend import VerifiedLocalBackend


def _saved(path, value=0.0, **save_args):
    """A checkpoint-like file of ~64 KiB (tensors in their own zip records)."""
    torch.save({"state_dict": {"w": torch.full((16384,), value)}}, str(path), **save_args)
    return str(path)


def _put(path, value=0.0):
    """``path`` saved as VerifiedCheckpointHook saves: through the backend."""
    with io.BytesIO() as f:
        torch.save({"state_dict": {"w": torch.full((16384,), value)}}, f)
        VerifiedLocalBackend().put(f.getvalue(), str(path))
    return str(path)


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


def _truncate(path, keep=0.5):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))


def test_whole_files_pass_with_and_without_a_digest(tmp_path):
    assert checkpoint_problem(_put(tmp_path / "a.pth")) is None
    assert checkpoint_problem(_saved(tmp_path / "b.pth")) is None


@pytest.mark.parametrize("digest", [True, False])
def test_truncated_empty_and_bit_flipped_files_are_named_damaged(tmp_path, digest):
    save = _put if digest else _saved
    truncated, empty, flipped = (save(tmp_path / f"{n}.pth") for n in ("t", "e", "f"))
    _truncate(truncated)
    open(empty, "wb").close()
    # Inside the tensor's record: torch.load reads it without complaint.
    _flip(flipped, os.path.getsize(flipped) // 2)
    assert torch.load(flipped, weights_only=True)["state_dict"]["w"].abs().max() > 0
    assert checkpoint_problem(empty) == "empty file (0 bytes)"
    if digest:
        for path in (truncated, flipped):
            assert "is not the" in checkpoint_problem(path)
            assert digest_path(path) in checkpoint_problem(path)
    else:
        assert "not a complete zip archive" in checkpoint_problem(truncated)
        assert "fails its CRC-32 check" in checkpoint_problem(flipped)


def test_a_digest_file_that_is_not_text_is_named(tmp_path):
    path = _put(tmp_path / "a.pth")
    with open(digest_path(path), "wb") as f:
        f.write(b"\xff\xfe\x80 not sha256sum's line\n")
    problem = checkpoint_problem(path)
    assert digest_path(path) in problem and "non-ASCII bytes" in problem


def test_files_that_record_nothing_to_check_pass(tmp_path):
    legacy = _saved(tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    assert checkpoint_problem(legacy) is None
    torch.serialization.set_crc32_options(False)
    try:
        no_crc = _saved(tmp_path / "no_crc.pth")
    finally:
        torch.serialization.set_crc32_options(True)
    assert checkpoint_problem(no_crc) is None


def test_backend_writes_atomically_and_removes_the_digest_too(tmp_path, monkeypatch):
    path = _put(tmp_path / "sub" / "epoch_1.pth")
    assert sorted(os.listdir(tmp_path / "sub")) == ["epoch_1.pth", "epoch_1.pth.sha256"]
    VerifiedLocalBackend().remove(path)
    assert os.listdir(tmp_path / "sub") == []

    # Stopped between the checkpoint and its digest: the new file is whole,
    # and no digest of the old one is left to call it damaged.
    path = _put(tmp_path / "epoch_2.pth", value=1.0)
    write = verified_backend.write_atomically

    def stop_at_the_digest(target, data):
        if target.endswith(".sha256"):
            raise KeyboardInterrupt
        write(target, data)

    monkeypatch.setattr(verified_backend, "write_atomically", stop_at_the_digest)
    with pytest.raises(KeyboardInterrupt):
        _put(path, value=2.0)
    assert sorted(os.listdir(tmp_path)) == ["epoch_2.pth", "sub"]
    assert checkpoint_problem(path) is None
    assert torch.load(path, weights_only=True)["state_dict"]["w"][0] == 2.0


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = _put(tmp_path / "epoch_1.pth", value=1.0)
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        verified_backend.write_atomically(path, b"partial")
    assert sorted(os.listdir(tmp_path)) == ["epoch_1.pth", "epoch_1.pth.sha256"]


class _Logger:
    def __init__(self):
        self.warnings = []

    def warning(self, message):
        self.warnings.append(message)


def _runner(work_dir, resume=True, load_from=None):
    return SimpleNamespace(work_dir=str(work_dir), _has_loaded=False, _resume=resume,
                           _load_from=load_from, logger=_Logger())


def _run_with_checkpoints(work_dir, epochs, last):
    """epoch_1.pth ... saved in order (increasing mtimes), last_checkpoint naming ``last``."""
    for epoch in epochs:
        path = _put(work_dir / f"epoch_{epoch}.pth", value=float(epoch))
        os.utime(path, (epoch, 1e9 + epoch))
    (work_dir / "last_checkpoint").write_text(str(work_dir / f"epoch_{last}.pth"))


def test_auto_resume_takes_the_latest_when_it_is_whole(tmp_path):
    _run_with_checkpoints(tmp_path, [1, 2, 3], last=3)
    runner = _runner(tmp_path)
    VerifiedCheckpointHook(interval=1).before_run(runner)
    assert runner._load_from == str(tmp_path / "epoch_3.pth") and runner._resume
    assert runner.logger.warnings == []


def test_auto_resume_falls_back_to_the_newest_whole_checkpoint_loudly(tmp_path):
    _run_with_checkpoints(tmp_path, [1, 2, 3], last=3)
    _truncate(tmp_path / "epoch_3.pth")
    open(tmp_path / "epoch_2.pth", "wb").close()
    runner = _runner(tmp_path)
    VerifiedCheckpointHook(interval=1).before_run(runner)
    assert runner._load_from == str(tmp_path / "epoch_1.pth") and runner._resume
    (warning,) = runner.logger.warnings
    assert warning.startswith(f"Resuming from {tmp_path / 'epoch_1.pth'}, the newest whole")
    assert f"{tmp_path / 'epoch_3.pth'} (its sha256" in warning
    assert f"{tmp_path / 'epoch_2.pth'} (empty file (0 bytes))" in warning


def test_auto_resume_without_a_whole_checkpoint_names_each(tmp_path):
    _run_with_checkpoints(tmp_path, [1], last=1)
    _truncate(tmp_path / "epoch_1.pth")
    with pytest.raises(DamagedCheckpointError, match=f"resume: no whole checkpoint in "
                                                      f"{tmp_path}: {tmp_path / 'epoch_1.pth'}"):
        VerifiedCheckpointHook(interval=1).before_run(_runner(tmp_path))


def test_auto_resume_with_nothing_to_resume_stops_naming_the_work_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"resume: nothing to resume in {tmp_path} "):
        VerifiedCheckpointHook(interval=1).before_run(_runner(tmp_path))
    runner = _runner(tmp_path)
    VerifiedCheckpointHook(interval=1, start_if_nothing_to_resume=True).before_run(runner)
    assert runner._load_from is None and not runner._resume
    assert runner.logger.warnings == [f"resume: nothing to resume in {tmp_path}; training "
                                      f"starts from scratch (start_if_nothing_to_resume=True)"]


@pytest.mark.parametrize("resume, role", [(False, "load_from"), (True, "resume from")])
def test_a_named_damaged_checkpoint_stops_and_offers_the_newest_whole(tmp_path, resume, role):
    _run_with_checkpoints(tmp_path, [1, 2], last=2)
    named = tmp_path / "epoch_2.pth"
    _flip(named, os.path.getsize(named) // 2)
    runner = _runner(tmp_path, resume=resume, load_from=str(named))
    with pytest.raises(DamagedCheckpointError) as stop:
        VerifiedCheckpointHook(interval=1).before_run(runner)
    assert str(stop.value).startswith(f"{role} {named}: damaged checkpoint, its sha256")
    assert str(stop.value).endswith(f"the newest whole checkpoint beside it is "
                                    f"{tmp_path / 'epoch_1.pth'}")
    shutil.copy(tmp_path / "epoch_1.pth", named)
    os.remove(digest_path(str(named)))
    VerifiedCheckpointHook(interval=1).before_run(runner)  # whole again: nothing raised


def test_the_hook_keeps_its_files_local():
    with pytest.raises(ValueError, match="backend_args must be None"):
        VerifiedCheckpointHook(backend_args=dict(backend="petrel"))


def test_nothing_is_checked_once_the_runner_has_loaded(tmp_path):
    runner = _runner(tmp_path)
    runner._has_loaded = True
    VerifiedCheckpointHook(interval=1).before_run(runner)
    assert runner._load_from is None and runner._resume
