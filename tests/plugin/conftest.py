"""Fixtures for the mmdet plugin tests."""
import logging

import pytest
import torch
from mmengine.logging import MMLogger

# Before any test module here imports mmcv.ops or mmdet.models: on mmcv-lite
# they are importable only once msda_mm has installed its mmcv._ext stub.
import msda_mm  # noqa: F401  (registrations and mmcv-lite shims)


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    # These tests run many small ops (model builds, init_weights' per-tensor
    # statistics): on a busy 2-core box each multi-threaded reduction waits
    # ~20 ms at the OpenMP barrier, 1000x the work itself.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def quiet_mmengine():
    """Keep init_weights' per-parameter INFO report out of the test log."""
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield
    logger.setLevel(level)
