"""The code passes ruff (the rules in pyproject.toml's [tool.ruff]), so that
the README's test command lints too."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, f"ruff check . failed:\n{run.stdout}{run.stderr}"
