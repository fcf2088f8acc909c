"""Fixtures for the mmdet plugin tests."""
import pytest

# Before any test module here imports mmcv.ops or mmdet.models: on mmcv-lite
# they are importable only once msda_mm has installed its mmcv._ext stub.
import msda_mm  # noqa: F401  (registrations and mmcv-lite shims)


@pytest.fixture(autouse=True)
def one_intra_op_thread(one_intra_op_thread):
    # These tests run many small ops (model builds, init_weights' per-tensor statistics).
    yield
