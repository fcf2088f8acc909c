"""tools/dist_train.sh and tools/dist_test.sh: argument checks, and the
torchrun command they run (seen through a PYTHON stub that prints its
arguments)."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
CONFIG = "configs/dino_bf16.py"
CHECKPOINT = "README.md"  # any existing file: the script only checks that it exists


LAUNCH_ENV = ("NNODES", "NODE_RANK", "MASTER_ADDR", "PORT")


def _run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """tools/``script`` with the caller's environment minus its launch
    settings, plus ``env``."""
    base = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    return subprocess.run(["bash", str(TOOLS / script), *args], cwd=ROOT, capture_output=True,
                          text=True, env={**base, **env}, timeout=60)


def _torchrun(gpus: int, tool: str, *args: str, nnodes=1, node_rank=0, addr="127.0.0.1",
              port=29500) -> list[str]:
    return ["-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--node_rank={node_rank}",
            f"--master_addr={addr}", f"--master_port={port}", f"--nproc_per_node={gpus}",
            f"{TOOLS}/{tool}", *args, "--launcher", "pytorch"]


@pytest.fixture
def echo_python(tmp_path) -> str:
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    stub.chmod(0o755)
    return str(stub)


@pytest.mark.parametrize("script, args", [
    ("dist_train.sh", ()), ("dist_train.sh", (CONFIG,)), ("dist_train.sh", (CONFIG, "two")),
    ("dist_train.sh", (CONFIG, "0")), ("dist_train.sh", ("configs/missing.py", "2")),
    ("dist_test.sh", (CONFIG, CHECKPOINT)), ("dist_test.sh", (CONFIG, CHECKPOINT, "-1")),
    ("dist_test.sh", (CONFIG, "missing.pth", "2")),
    ("dist_test.sh", ("configs/missing.py", CHECKPOINT, "2")),
])
def test_bad_arguments_print_usage(script, args, echo_python):
    result = _run(script, *args, PYTHON=echo_python)
    assert result.returncode == 2
    assert "usage:" in result.stderr and result.stdout == ""


def test_train_defaults_launch_one_node(echo_python):
    result = _run("dist_train.sh", CONFIG, "8", PYTHON=echo_python)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == _torchrun(8, "train.py", CONFIG)


@pytest.mark.parametrize("checkpoint", [CHECKPOINT, "https://download.openmmlab.com/x.pth"])
def test_test_defaults_launch_one_node(checkpoint, echo_python):
    # A URL checkpoint is mmengine's to download, not a file to check.
    result = _run("dist_test.sh", CONFIG, checkpoint, "2", PYTHON=echo_python)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == _torchrun(2, "test.py", CONFIG, checkpoint)


@pytest.mark.parametrize("script, positional, tool", [
    ("dist_train.sh", (CONFIG, "4"), ("train.py", CONFIG)),
    ("dist_test.sh", (CONFIG, CHECKPOINT, "4"), ("test.py", CONFIG, CHECKPOINT)),
])
def test_environment_and_extra_arguments_pass_through(script, positional, tool, echo_python):
    result = _run(script, *positional, "--work-dir", "work dir", "--cfg-options", "a=1",
                  PYTHON=echo_python, NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.1",
                  PORT="29555")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == _torchrun(
        4, *tool, "--work-dir", "work dir", "--cfg-options", "a=1", nnodes=2, node_rank=1,
        addr="10.0.0.1", port=29555)
