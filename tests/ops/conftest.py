"""Fixtures shared by the operator tests."""
import pytest

from msda_mm.ops.forward import launcher as forward_launcher
from msda_mm.ops.tiles import SORTS, tile_override


@pytest.fixture
def pairs_launches(monkeypatch):
    """Every forward that can take msda_fwd_pairs_kernel takes it (4 queries
    a program, so the small Q of the tests leave partial blocks); yields its
    launches."""
    launches, real = [], forward_launcher.msda_fwd_pairs_kernel

    class Spy:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    monkeypatch.setattr(forward_launcher, "msda_fwd_pairs_kernel", Spy())
    with tile_override(pairs=(4, 1)):
        yield launches


@pytest.fixture(params=SORTS)
def sort(request):
    """Each of the deterministic backward's sorts, whatever the rows' density
    (Tiles.deterministic_sort); yields its name."""
    with tile_override(sort=request.param):
        yield request.param
