"""The runs the workflow tests share, made as a user makes them: the CPU
demo config on a handful of images, trained with tools/train.py, killed in
its second epoch, then resumed."""
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tool_runs import ROOT, tool_env, write_tiny_demo

# Two epochs, logged every iteration (to see where the run is).
TWO_EPOCHS = ("--cfg-options", "train_cfg.max_epochs=2", "default_hooks.logger.interval=1")
AP_LINE = "bbox_mAP_copypaste"


def run(*args, timeout=600) -> subprocess.CompletedProcess:
    """``python ARGS`` from the checkout's root; stdout and stderr together."""
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, env=tool_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def mmdet_tool(name: str) -> str:
    from msda_mm.mmdet_tools import mmdet_tool as path

    return path(name)


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    # last_checkpoint names the file by its path in the run it came from.
    last = dst / "last_checkpoint"
    last.write_text(last.read_text().replace(str(src), str(dst)))
    return dst


@pytest.fixture(scope="package")
def tiny_demo(made_once) -> Path:
    # The demo's own checkpoint settings; 4 iterations an epoch.
    folder = made_once("tiny_demo", lambda folder: write_tiny_demo(
        folder / "tiny_demo.py", f"{folder}/data/", num_train=16))
    return folder / "tiny_demo.py"


@pytest.fixture(scope="package")
def killed_run(tiny_demo, made_once) -> Path:
    """tools/train.py on the demo for 2 epochs, killed after the first
    iteration of the second (three iterations before it could save)."""
    return made_once("killed", lambda folder: kill_in_epoch_2(
        tiny_demo, folder / "work")) / "work"


def kill_in_epoch_2(tiny_demo: Path, work_dir: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tools/train.py"), str(tiny_demo), "--work-dir",
         str(work_dir), *TWO_EPOCHS], cwd=ROOT, env=tool_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(600, proc.kill)
    watchdog.start()
    log = []
    for line in proc.stdout:
        log.append(line)
        if "Epoch(train) [2][1/4]" in line:
            proc.kill()
            break
    watchdog.cancel()
    proc.wait()
    assert "Epoch(train) [2][1/4]" in log[-1], "".join(log)[-4000:]


@pytest.fixture(scope="package")
def resumed_run(killed_run, tiny_demo, made_once) -> tuple[Path, str]:
    """The killed run resumed with tools/train.py --resume: (work dir, log)."""
    def resume(folder: Path) -> None:
        work_dir = copy_run(killed_run, folder / "work")
        done = run(ROOT / "tools/train.py", tiny_demo, "--work-dir", work_dir, "--resume",
                   *TWO_EPOCHS)
        assert done.returncode == 0, done.stdout[-4000:]
        (folder / "resume.log").write_text(done.stdout)

    folder = made_once("resumed", resume)
    return folder / "work", (folder / "resume.log").read_text()
