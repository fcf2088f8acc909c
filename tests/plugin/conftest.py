"""Fixtures for the mmdet plugin tests."""
import logging

import pytest
from mmengine.logging import MMLogger

# Before any test module here imports mmcv.ops or mmdet.models: on mmcv-lite
# they are importable only once msda_mm has installed its mmcv._ext stub.
import msda_mm  # noqa: F401  (registrations and mmcv-lite shims)


@pytest.fixture(autouse=True)
def one_intra_op_thread(one_intra_op_thread):
    # These tests run many small ops (model builds, init_weights' per-tensor statistics).
    yield


@pytest.fixture
def quiet_mmengine():
    """Keep init_weights' per-parameter INFO report out of the test log."""
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield
    logger.setLevel(level)
