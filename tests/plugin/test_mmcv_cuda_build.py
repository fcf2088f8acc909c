"""Building mmcv's MSDA kernels from the user's sdist, on CPU: what is taken
from the tarball and how it is patched, the build folder and its reuse, what
the compiler is asked for, and each way it can fail (cpp_extension.load
stands in for the compiler)."""
import hashlib
import os
import types
from pathlib import Path

import pytest
import torch
from mmcv_fakes import FAKE_SOURCES, THC, fake_build, fake_sdist, member, pretend_gpu

from msda_mm.compat import mmcv_cuda_build
from msda_mm.compat.mmcv_cuda_build import BuildError
from msda_mm.compat.mmcv_sdist import SOURCES, SdistError, extract_sources, sdist_url

ATEN = "#include <ATen/cuda/Atomic.cuh>"
PATCHED = ("pytorch/cuda/ms_deform_attn_cuda.cu", "common/pytorch_cuda_helper.hpp")


def test_only_the_op_sources_are_read_and_thc_is_swapped(tmp_path):
    sdist = fake_sdist(tmp_path)
    sources = extract_sources(sdist)
    assert sources.version == "2.1.0"
    assert sources.sha256 == hashlib.sha256(sdist.read_bytes()).hexdigest()
    assert set(sources.files) == set(SOURCES)
    for rel, text in sources.files.items():
        # Exactly the one include swapped, every other byte as in the tarball.
        assert text.decode() == FAKE_SOURCES[rel].replace(THC, ATEN)
        assert (ATEN in text.decode()) == (rel in PATCHED)


def test_the_build_folder_holds_the_sources_and_binding_only(tmp_path):
    folder = tmp_path / "build"
    files, includes = mmcv_cuda_build.write_sources(extract_sources(fake_sdist(tmp_path)), folder)
    written = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert written == sorted(["binding.cpp", *(f"src/{rel}" for rel in SOURCES)])
    assert files == [str(folder / "binding.cpp"),
                     str(folder / "src/pytorch/cuda/ms_deform_attn_cuda.cu")]
    assert includes == [str(folder / "src/common"), str(folder / "src/common/cuda")]
    binding = (folder / "binding.cpp").read_text()
    # mmcv._ext's names and keyword arguments, which mmcv's Function calls.
    for name in ("ms_deform_attn_forward", "ms_deform_attn_backward", 'py::arg("im2col_step")',
                 'py::arg("grad_attn_weight")', "PYBIND11_MODULE(TORCH_EXTENSION_NAME"):
        assert name in binding


def test_missing_sources_are_named(tmp_path):
    drop = ("common/cuda/ms_deform_attn_cuda_kernel.cuh", "common/pytorch_cuda_helper.hpp")
    with pytest.raises(SdistError) as e:
        extract_sources(fake_sdist(tmp_path, drop=drop))
    assert "is not an mmcv sdist with the CUDA sources" in str(e.value)
    assert all(member("2.1.0", rel) in str(e.value) for rel in drop)
    assert member("2.1.0", SOURCES[0]) not in str(e.value)


def test_a_missing_or_broken_file_says_so(tmp_path):
    with pytest.raises(SdistError, match="sdist: no such file: .*nothing.tar.gz"):
        extract_sources(tmp_path / "nothing.tar.gz")
    junk = tmp_path / "mmcv-2.1.0.tar.gz"
    junk.write_bytes(b"not a tarball")
    with pytest.raises(SdistError, match="is not a readable tar archive"):
        extract_sources(junk)
    (tmp_path / "whole").mkdir()
    whole = fake_sdist(tmp_path / "whole").read_bytes()
    for name, data in (("truncated", whole[:len(whole) // 2]),
                       ("damaged", whole[:40] + bytes(64) + whole[104:])):
        cut = tmp_path / name / "mmcv-2.1.0.tar.gz"
        cut.parent.mkdir()
        cut.write_bytes(data)
        with pytest.raises(SdistError, match=f"{cut} is not a readable tar archive"):
            extract_sources(cut)


def test_another_thc_include_is_refused(tmp_path):
    cu = SOURCES[0]
    sdist = fake_sdist(tmp_path, sources={cu: FAKE_SOURCES[cu] + "#include <THC/THC.h>\n"})
    with pytest.raises(SdistError, match=f"{cu} includes #include <THC/THC.h>"):
        extract_sources(sdist)


def test_the_sdist_must_be_the_installed_mmcv(tmp_path):
    with pytest.raises(BuildError, match="is mmcv 2.2.0, but mmcv 2.1.0 is installed"):
        mmcv_cuda_build.build(fake_sdist(tmp_path, version="2.2.0"))


@pytest.fixture
def toolchain(monkeypatch, tmp_path):
    """A CUDA torch on an sm 9.0 GPU with nvcc and ninja, builds cached under tmp_path."""
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "nvcc").write_text("")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    pretend_gpu(monkeypatch, tmp_path / "cache")
    monkeypatch.setattr(mmcv_cuda_build.cpp_extension, "CUDA_HOME", str(home))
    monkeypatch.setattr(mmcv_cuda_build.cpp_extension, "is_ninja_available", lambda: True)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    return home


@pytest.mark.parametrize("missing, message", [
    ("torch_cuda", "is built without CUDA: install a CUDA build of torch"),
    ("gpu", "no CUDA device is visible"),
    ("toolkit", "no CUDA toolkit found .*set CUDA_HOME"),
    ("nvcc", "CUDA_HOME=.* has no bin/nvcc"),
    ("ninja", "ninja is missing .*pip install ninja"),
])
def test_a_missing_toolchain_part_is_named(tmp_path, toolchain, monkeypatch, missing, message):
    broken = {"torch_cuda": (torch.version, "cuda", None),
              "gpu": (torch.cuda, "is_available", lambda: False),
              "toolkit": (mmcv_cuda_build.cpp_extension, "CUDA_HOME", None),
              "nvcc": (mmcv_cuda_build.cpp_extension, "CUDA_HOME", str(tmp_path)),
              "ninja": (mmcv_cuda_build.cpp_extension, "is_ninja_available", lambda: False)}
    monkeypatch.setattr(*broken[missing])
    with pytest.raises(BuildError, match=message):
        mmcv_cuda_build.build(fake_sdist(tmp_path))


class FakeCompiler:
    """cpp_extension.load: records its arguments and TORCH_CUDA_ARCH_LIST,
    writes the library file and returns a module named like the extension,
    with the two ops."""

    def __init__(self):
        self.calls = []

    def __call__(self, name, sources, extra_include_paths, extra_cflags, extra_cuda_cflags,
                 build_directory, verbose):
        self.calls.append(dict(name=name, sources=sources, includes=extra_include_paths,
                               flags=(extra_cflags, extra_cuda_cflags), folder=build_directory,
                               arch_list=os.environ.get("TORCH_CUDA_ARCH_LIST")))
        library = Path(build_directory) / f"{name}.so"
        library.write_bytes(b"")
        module = types.ModuleType(name)
        module.__file__ = str(library)
        module.ms_deform_attn_forward = module.ms_deform_attn_backward = print
        return module


def test_a_build_lands_in_the_cache_and_is_reused(tmp_path, toolchain, monkeypatch):
    compiler = FakeCompiler()
    monkeypatch.setattr(mmcv_cuda_build.cpp_extension, "load", compiler)
    sdist = fake_sdist(tmp_path)
    built = mmcv_cuda_build.build(sdist)
    folder = tmp_path / "cache/msda_mm/mmcv_msda" / f"2.1.0-torch{torch.__version__}-sm90"
    assert built.folder == folder and built.compiled
    assert built.library == folder / "msda_mm_mmcv_msda.so"
    assert compiler.calls == [dict(
        name="msda_mm_mmcv_msda", folder=str(folder), arch_list="9.0",
        flags=(["-O3"], ["-O3"]),
        sources=[str(folder / "binding.cpp"), str(folder / "src" / SOURCES[0])],
        includes=[str(folder / "src/common"), str(folder / "src/common/cuda")])]
    assert "TORCH_CUDA_ARCH_LIST" not in os.environ
    m = mmcv_cuda_build.read_manifest(folder)
    assert (m.mmcv, m.torch, m.cuda, m.capability, m.sdist_sha256, m.module, m.library) == (
        "2.1.0", torch.__version__, "13.0", "9.0", extract_sources(sdist).sha256,
        "msda_mm_mmcv_msda", "msda_mm_mmcv_msda.so")
    assert mmcv_cuda_build.found_build() == folder
    # The module the build imported is the one loaded: no second import.
    assert mmcv_cuda_build.load_extension().__file__ == str(built.library)
    # The same sdist again: nothing compiled, unless forced.
    again = mmcv_cuda_build.build(sdist)
    assert not again.compiled and again.manifest == m and len(compiler.calls) == 1
    assert mmcv_cuda_build.build(sdist, force=True).compiled and len(compiler.calls) == 2


def test_the_users_arch_list_is_kept(tmp_path, toolchain, monkeypatch):
    compiler = FakeCompiler()
    monkeypatch.setattr(mmcv_cuda_build.cpp_extension, "load", compiler)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    built = mmcv_cuda_build.build(fake_sdist(tmp_path), tmp_path / "mine")
    assert compiler.calls[0]["arch_list"] == built.manifest.arch_list == "9.0a"
    assert built.folder == tmp_path / "mine" and os.environ["TORCH_CUDA_ARCH_LIST"] == "9.0a"


def test_a_failed_compile_points_at_its_log(tmp_path, toolchain, monkeypatch):
    def failing(**kwargs):
        raise RuntimeError("Error building extension 'msda_mm_mmcv_msda': nvcc fatal: sm_99")

    monkeypatch.setattr(mmcv_cuda_build.cpp_extension, "load", failing)
    with pytest.raises(BuildError, match="compiler's output is in .*build.log") as e:
        mmcv_cuda_build.build(fake_sdist(tmp_path))
    log = Path(str(e.value).rsplit(" ", 1)[-1])
    assert "nvcc fatal: sm_99" in log.read_text()
    assert mmcv_cuda_build.read_manifest(log.parent) is None
    assert "TORCH_CUDA_ARCH_LIST" not in os.environ


def test_a_failed_rebuild_leaves_no_build_behind(tmp_path, toolchain, monkeypatch):
    monkeypatch.setattr(mmcv_cuda_build.cpp_extension, "load", FakeCompiler())
    built = mmcv_cuda_build.build(fake_sdist(tmp_path))

    def failing(**kwargs):
        raise RuntimeError("Error building extension: out of disk")

    monkeypatch.setattr(mmcv_cuda_build.cpp_extension, "load", failing)
    with pytest.raises(BuildError):
        mmcv_cuda_build.build(fake_sdist(tmp_path), force=True)
    assert mmcv_cuda_build.read_manifest(built.folder) is None


def test_a_build_loads_once_and_says_where_it_is_from(tmp_path):
    folder = fake_build(tmp_path / "b")
    module = mmcv_cuda_build.load_extension(folder)
    assert callable(module.ms_deform_attn_forward) and callable(module.ms_deform_attn_backward)
    assert mmcv_cuda_build.load_extension(folder) is module
    assert mmcv_cuda_build.describe(module) == \
        "mmcv 2.1.0 CUDA kernels (msda_mm build, sm 9.0)"
    assert mmcv_cuda_build.describe(types.ModuleType("mmcv._ext")) == \
        "mmcv CUDA kernels (mmcv._ext)"


def test_loading_says_what_is_wrong(tmp_path, toolchain):
    with pytest.raises(BuildError, match="no build of mmcv's MSDA kernels in .*"
                                         "tools/build_mmcv_msda.py --sdist mmcv-2.1.0.tar.gz"):
        mmcv_cuda_build.load_extension()
    with pytest.raises(BuildError, match="built for torch 1.0, this is torch"):
        mmcv_cuda_build.load_extension(fake_build(tmp_path / "old", torch="1.0"))
    with pytest.raises(BuildError, match="compute capability 8.0, this GPU's is 9.0"):
        mmcv_cuda_build.load_extension(fake_build(tmp_path / "a100", capability="8.0"))
    with pytest.raises(BuildError, match="lacks ms_deform_attn_backward"):
        mmcv_cuda_build.load_extension(fake_build(tmp_path / "half",
                                                  "def ms_deform_attn_forward(): pass\n"))


def test_the_sdist_url_is_read_from_pips_log():
    url = "https://files.example.org/packages/a7/19/f9/mmcv-2.1.0.tar.gz"
    log = (f"  Found link {url} (from https://pypi.org/simple/mmcv/), version: 2.1.0\n"
           f"  Found link https://files.example.org/mmcv-2.0.0.tar.gz (from x), version: 2.0.0\n"
           f"Added mmcv==2.1.0 from {url} to build tracker '/tmp/pip-build-tracker-x'\n"
           "  ModuleNotFoundError: No module named 'pkg_resources'\n")
    assert sdist_url(log, "2.1.0") == url
    assert sdist_url(log.splitlines()[0], "2.1.0") == url
    with pytest.raises(SdistError, match="pip's log names no mmcv-2.2.0.tar.gz"):
        sdist_url(log, "2.2.0")
