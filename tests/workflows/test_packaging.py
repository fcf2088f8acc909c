"""``python -m build`` gives an sdist and a wheel that each install into a
fresh venv and work from there: msda_mm imports from the venv (not the
checkout), its op matches the reference on a tiny CPU input, and the
console scripts are installed (TRITON_INTERPRET=1, from the root conftest:
the kernels run in Triton's interpreter).  The wheel holds msda_mm only (not
the lab, bench/); the sdist the source tree without benchmarks/."""
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

import msda_mm

from .conftest import ROOT

SMOKE = """
import sys, torch, msda_mm
from msda_mm import msda_reference, multi_scale_deformable_attention
shapes = torch.tensor([[3, 4], [2, 2]])
starts = torch.tensor([0, 12])
gen = torch.Generator().manual_seed(0)
value = torch.randn(1, 16, 2, 4, generator=gen, dtype=torch.float64)
loc = torch.rand(1, 3, 2, 2, 2, 2, generator=gen, dtype=torch.float64)
attn = torch.rand(1, 3, 2, 2, 2, generator=gen, dtype=torch.float64)
out = multi_scale_deformable_attention(value, shapes, starts, loc, attn)
torch.testing.assert_close(out, msda_reference(value, shapes, loc, attn, starts))
print(msda_mm.__file__)
"""


def _sh(*args, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300,
                          **kwargs)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the build backend (setuptools, a dependency) is
    # installed already; an isolated build would download it each time.
    _sh(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT)
    (sdist,), (wheel,) = out.glob("*.tar.gz"), out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


def _venv_beside_this_one(venv: Path) -> Path:
    """A fresh venv whose own site-packages come first, then this
    interpreter's (torch, mmdet, setuptools, pip: whatever runs the tests,
    a user's venv or a system Python).  ``--system-site-packages`` would
    expose the base interpreter's instead, which inside a venv lacks them."""
    _sh(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    site = _sh(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    # A .pth line appends its folder to sys.path without running that folder's
    # own .pth files: a development install of msda_mm there stays invisible.
    (Path(site.stdout.strip()) / "outer_site_packages.pth").write_text("\n".join(ours) + "\n")
    return python


def test_the_wheel_holds_the_package_only(dist):
    names = zipfile.ZipFile(dist["wheel"]).namelist()
    assert "msda_mm/ops/forward/kernels.py" in names and "msda_mm/mmdet_tools.py" in names
    info = f"msda_mm-{msda_mm.__version__}.dist-info"
    assert {n.split("/")[0] for n in names} == {"msda_mm", info}
    entry_points = zipfile.ZipFile(dist["wheel"]).read(f"{info}/entry_points.txt")
    assert b"msda-mm-train = msda_mm.mmdet_tools:run_train" in entry_points


def test_the_sdist_holds_the_source_tree_but_benchmarks(dist):
    with tarfile.open(dist["sdist"]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"pyproject.toml", "conftest.py", "msda_mm/ops/forward/kernels.py",
            "tests/ops/msda_inputs.py", "research/codegen.py",
            "configs/synthetic/dino_tiny_cpu.py", "tools/train.py", "bench/op/timing.py",
            "bench/step/plot.py"} <= names
    assert not [n for n in names if n.startswith("benchmarks") or "__pycache__" in n]


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_it_installs_into_a_fresh_venv_and_runs(dist, kind, tmp_path):
    venv = tmp_path / "venv"
    python = _venv_beside_this_one(venv)
    # The sdist builds with this interpreter's setuptools (pyproject's range).
    _sh(python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
        "--ignore-installed", dist[kind])
    # Outside the checkout, which must not be importable.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = _sh(python, "-c", SMOKE, cwd=tmp_path, env=env)
    assert done.stdout.strip().startswith(str(venv)), done.stdout
    assert (venv / "bin" / "msda-mm-train").is_file() and (venv / "bin" / "msda-mm-test").is_file()
