"""Fixtures shared by the operator tests."""
import pytest

from msda_mm.ops import launch


@pytest.fixture
def pairs_launches(monkeypatch):
    """Every forward that can take msda_fwd_pairs_kernel takes it (4 queries
    a program, so the small Q of the tests leave partial blocks); yields its
    launches."""
    launches, real = [], launch.msda_fwd_pairs_kernel

    class Spy:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    monkeypatch.setattr(launch, "msda_fwd_pairs_kernel", Spy())
    with launch.tile_override(pairs=(4, 1)):
        yield launches


@pytest.fixture(params=launch._SORTS)
def sort(request):
    """Each of the deterministic backward's sorts, whatever the rows' density
    (launch.deterministic_sort); yields its name."""
    with launch.tile_override(sort=request.param):
        yield request.param
