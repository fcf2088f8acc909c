"""tools/dist_train.sh: argument checks, and the torchrun command it runs
(seen through a PYTHON stub that prints its arguments)."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "dist_train.sh"
CONFIG = "configs/dino_bf16.py"


LAUNCH_ENV = ("NNODES", "NODE_RANK", "MASTER_ADDR", "PORT")


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    """The script with the caller's environment minus its launch settings,
    plus ``env``."""
    base = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          env={**base, **env}, timeout=60)


@pytest.fixture
def echo_python(tmp_path) -> str:
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    stub.chmod(0o755)
    return str(stub)


@pytest.mark.parametrize("args", [(), (CONFIG,), (CONFIG, "two"), (CONFIG, "0"),
                                  ("configs/missing.py", "2")])
def test_bad_arguments_print_usage(args, echo_python):
    result = _run(*args, PYTHON=echo_python)
    assert result.returncode == 2
    assert "usage:" in result.stderr and result.stdout == ""


def test_defaults_launch_one_node(echo_python):
    result = _run(CONFIG, "8", PYTHON=echo_python)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "-m", "torch.distributed.run", "--nnodes=1", "--node_rank=0",
        "--master_addr=127.0.0.1", "--master_port=29500", "--nproc_per_node=8",
        f"{SCRIPT.parent}/train.py", CONFIG, "--launcher", "pytorch"]


def test_environment_and_extra_arguments_pass_through(echo_python):
    result = _run(CONFIG, "4", "--work-dir", "work dir", "--cfg-options", "a=1",
                  PYTHON=echo_python, NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.1",
                  PORT="29555")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "-m", "torch.distributed.run", "--nnodes=2", "--node_rank=1",
        "--master_addr=10.0.0.1", "--master_port=29555", "--nproc_per_node=4",
        f"{SCRIPT.parent}/train.py", CONFIG, "--launcher", "pytorch",
        "--work-dir", "work dir", "--cfg-options", "a=1"]
