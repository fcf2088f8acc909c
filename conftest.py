"""Test-session set-up.

Without a GPU the Triton kernels run in Triton's interpreter on CPU tensors:
TRITON_INTERPRET must be set before msda_mm (and so the @triton.jit kernels)
is imported, which is why it happens here and not in a fixture.
"""
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without it, never called
def pytest_xdist_auto_num_workers(config):
    # `-n auto` with a GPU: one process, so that no two share the device.
    return 0 if HAS_CUDA else None


def pytest_collection_modifyitems(config, items):
    # GPU tests are never skipped silently: they say why in the report.
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs CUDA: run `python -m pytest -m gpu tests` on the H200")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def one_intra_op_thread():
    """torch on one intra-op thread: on a busy 2-core box each multi-threaded
    reduction of a small op waits ~20 ms at the OpenMP barrier, 1000x the
    work itself (model builds, init_weights' per-tensor statistics)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def reference_backend(monkeypatch):
    """Run CPU tensors through the pure-PyTorch reference instead of the
    interpreted kernels (whole-model tests would take minutes in the
    interpreter).  Dispatch reads TRITON_INTERPRET at call time."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
