"""Test set-up for the whole suite.

Without a GPU the Triton kernels run in Triton's interpreter on CPU tensors:
TRITON_INTERPRET must be set before msda_mm (and so the @triton.jit kernels)
is imported, which is why it happens here and not in a fixture.
"""
import functools
import gc
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
from filelock import FileLock

HAS_CUDA = torch.cuda.is_available()


def _patch_language_once_a_launch():
    """Triton's interpreter patches triton.language for the kernel at each
    launch, and again at every call of a @triton.jit helper inside it: a
    third of an interpreted kernel's time.  A helper whose language modules
    (triton.language, triton.language.core) the launch has patched already
    now skips that; the kernels run as before."""
    import triton.language as tl
    from triton.runtime import interpreter

    if not (hasattr(interpreter, "_patch_lang") and hasattr(interpreter, "GridExecutor")):
        return  # another Triton's interpreter: the kernels run unpatched, only slower
    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    patched = []  # the running launch's patched language modules

    @functools.wraps(patch_lang)
    def patch_lang_once(fn):
        langs = {v for v in fn.__globals__.values() if v is tl or v is tl.core}
        if patched and langs and langs <= patched[-1]:
            return None  # a helper's call: nothing reads what it returns
        if patched:
            patched[-1] |= langs
        return patch_lang(fn)

    @functools.wraps(launch)
    def launch_patching_once(self, *args, **kwargs):
        patched.append(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched.pop()

    interpreter._patch_lang = patch_lang_once
    interpreter.GridExecutor.__call__ = launch_patching_once


if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    _patch_language_once_a_launch()


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


@pytest.fixture(autouse=True)
def release_gpu_memory(request):
    """After each GPU test the caching allocator's free blocks go back to the
    device: processes sharing the GPU (pytest-xdist's workers) run out of
    memory where one keeps a large test's cache (40 GB on an 80 GB card)."""
    yield
    if HAS_CUDA and "gpu" in request.keywords:
        gc.collect()
        torch.cuda.empty_cache()


@pytest.fixture
def one_intra_op_thread():
    """torch on one intra-op thread: on a busy 2-core box each multi-threaded
    reduction of a small op waits ~20 ms at the OpenMP barrier, 1000x the
    work itself (model builds, init_weights' per-tensor statistics)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def made_once(tmp_path_factory):
    """``made_once(name, make)``: the folder ``name`` that ``make(folder)``
    fills, made once per test run.  Under pytest-xdist the first worker to
    ask makes it in the workers' common temporary folder, and the others
    wait for it and read it; a worker that failed half way leaves it to be
    made again."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent

    def get(name: str, make: Callable[[Path], None]) -> Path:
        folder, done = root / name, root / f"{name}.done"
        with FileLock(str(root / f"{name}.lock")):
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                make(folder)
                done.touch()
        return folder

    return get


@pytest.fixture
def reference_backend(monkeypatch):
    """Run CPU tensors through the pure-PyTorch reference instead of the
    interpreted kernels (whole-model tests would take minutes in the
    interpreter).  Dispatch reads TRITON_INTERPRET at call time."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.fixture
def quiet_mmengine():
    """Keep init_weights' per-parameter INFO report out of the test log."""
    import logging

    from mmengine.logging import MMLogger

    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield
    logger.setLevel(level)
