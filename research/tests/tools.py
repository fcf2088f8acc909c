"""The research/ command-line tools loaded as modules, and the checks every
GPU tool passes on any machine: a bad command line says what is wrong, and
without CUDA the tool says it needs a GPU."""
import runpy
from pathlib import Path

import pytest


def load(script: str) -> dict:
    """research/<script>'s globals, run as a module (not as __main__)."""
    return runpy.run_path(str(Path(__file__).resolve().parents[1] / script))


def assert_usage_error(script: str, args: list, message: str, capsys) -> None:
    with pytest.raises(SystemExit):
        load(script)["parse_args"](args)
    assert message in capsys.readouterr().err


def assert_needs_a_gpu(script: str) -> None:
    with pytest.raises(SystemExit, match="needs a GPU"):
        load(script)["main"]([])
