"""The ``msda-mm-train`` and ``msda-mm-test`` commands: mmdet's own
tools/train.py and tools/test.py (its wheel ships them under
``mmdet/.mim/tools``), same arguments, run with msda_mm imported first.

mmdet's test.py imports mmdet.engine, and with it mmcv.ops, before it reads
the config: on mmcv-lite it stops at ``No module named 'mmcv._ext'`` before
a config's ``custom_imports`` could install msda_mm's shims, so no config
can make it run.  Importing msda_mm first installs them (and the checkpoint
allow-list); then the tool runs as ``python tools/<name>`` would.
"""
from __future__ import annotations

import os.path as osp
import runpy
import sys


def mmdet_tool(name: str) -> str:
    """The path of mmdet's tools/``name`` in the installed mmdet."""
    import mmdet

    path = osp.join(osp.dirname(mmdet.__file__), ".mim", "tools", name)
    if not osp.isfile(path):
        raise SystemExit(f"mmdet's tools/{name} is not at {path}: an mmdet installed from a "
                         f"source tree keeps it in that tree; run it there as python -c "
                         f"\"import msda_mm, runpy, sys; sys.argv.pop(0); "
                         f"runpy.run_path(sys.argv[0], run_name='__main__')\" tools/{name} ...")
    return path


def _run(name: str) -> None:
    import msda_mm  # noqa: F401  (mmcv-lite shims, registrations, checkpoint allow-list)

    path = mmdet_tool(name)
    sys.argv[0] = path
    runpy.run_path(path, run_name="__main__")


def run_train() -> None:
    """``msda-mm-train CONFIG [mmdet tools/train.py's options]``."""
    _run("train.py")


def run_test() -> None:
    """``msda-mm-test CONFIG CHECKPOINT [mmdet tools/test.py's options]``."""
    _run("test.py")
