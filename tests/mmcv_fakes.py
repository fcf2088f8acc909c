"""Stand-ins for mmcv's sdist and for a build of its MSDA kernels, made in
the test: no network, no CUDA, no mmcv code."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import torch

from msda_mm.compat import mmcv_cuda_build
from msda_mm.compat.mmcv_sdist import SOURCES

THC = "#include <THC/THCAtomics.cuh>"

# Each op source holds the include to swap or one of the others it has.
FAKE_SOURCES = {
    "pytorch/cuda/ms_deform_attn_cuda.cu":
        f"#include <ATen/ATen.h>\n{THC}\n#include \"ms_deform_attn_cuda_kernel.cuh\"\n"
        "at::Tensor ms_deform_attn_cuda_forward();\n",
    "common/cuda/ms_deform_attn_cuda_kernel.cuh":
        "#include \"common_cuda_helper.hpp\"\n#include \"pytorch_cuda_helper.hpp\"\n",
    "common/cuda/common_cuda_helper.hpp": "#define THREADS_PER_BLOCK 512\n",
    "common/pytorch_cuda_helper.hpp": f"#include <ATen/cuda/CUDAApplyUtils.cuh>\n{THC}\n",
}
assert set(FAKE_SOURCES) == set(SOURCES)


def member(version: str, rel: str) -> str:
    """The tarball name of an op source."""
    return f"mmcv-{version}/mmcv/ops/csrc/{rel}"


def fake_sdist(folder: Path, version: str = "2.1.0", drop=(), sources=None) -> Path:
    """mmcv-<version>.tar.gz with PKG-INFO, the op's sources (``sources``
    overriding FAKE_SOURCES, ``drop`` leaving some out) and two other files."""
    files = {f"mmcv-{version}/PKG-INFO": f"Metadata-Version: 2.1\nName: mmcv\nVersion: {version}\n",
             f"mmcv-{version}/setup.py": "raise SystemExit('never run')\n",
             member(version, "pytorch/nms.cpp"): "// another op\n"}
    files.update({member(version, rel): text for rel, text in
                  dict(FAKE_SOURCES, **(sources or {})).items() if rel not in drop})
    path = Path(folder) / f"mmcv-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


# A kernels module as mmcv._ext's two functions, computing with msda_mm's
# reference, that records what mmcv's Function hands it.
KERNELS_SOURCE = '''
import torch
from msda_mm import msda_reference

CALLS = []


def ms_deform_attn_forward(value, value_spatial_shapes, value_level_start_index,
                           sampling_locations, attention_weights, im2col_step):
    CALLS.append(dict(op="forward", dtypes=(value.dtype, sampling_locations.dtype,
                                            attention_weights.dtype), im2col_step=im2col_step))
    return msda_reference(value, value_spatial_shapes, sampling_locations, attention_weights,
                          value_level_start_index)


def ms_deform_attn_backward(value, value_spatial_shapes, value_level_start_index,
                            sampling_locations, attention_weights, grad_output, grad_value,
                            grad_sampling_loc, grad_attn_weight, im2col_step):
    CALLS.append(dict(op="backward", im2col_step=im2col_step))
    leaves = [t.detach().requires_grad_() for t in (value, sampling_locations, attention_weights)]
    with torch.enable_grad():
        out = msda_reference(leaves[0], value_spatial_shapes, leaves[1], leaves[2],
                             value_level_start_index)
        grads = torch.autograd.grad(out, leaves, grad_output)
    for buffer, grad in zip((grad_value, grad_sampling_loc, grad_attn_weight), grads):
        buffer.copy_(grad)
'''


def fake_build(folder: Path, source: str = KERNELS_SOURCE, **manifest) -> Path:
    """A build folder whose library is ``source`` as a Python module."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fake_kernels.py").write_text(source)
    fields = dict(mmcv="2.1.0", torch=torch.__version__, cuda="13.0", capability="9.0",
                  arch_list="9.0", sdist="mmcv-2.1.0.tar.gz", sdist_sha256="0" * 64,
                  module="fake_kernels", library="fake_kernels.py")
    fields.update(manifest)
    (folder / mmcv_cuda_build.MANIFEST).write_text(json.dumps(fields))
    return folder


def pretend_gpu(monkeypatch, cache: Path) -> Path:
    """torch sees an sm 9.0 GPU and msda_mm's builds are cached under
    ``cache``; returns the default build folder (not made)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return mmcv_cuda_build.default_build_dir()
