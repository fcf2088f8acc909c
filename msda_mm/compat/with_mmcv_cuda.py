"""Importing this module switches mmcv's ``MultiScaleDeformableAttention``
to mmcv's own CUDA kernels on mmcv-lite: the config-level way,

    custom_imports = dict(imports=['msda_mm', 'msda_mm.compat.with_mmcv_cuda'],
                          allow_failed_imports=False)

It loads the build for this GPU (tools/build_mmcv_msda.py), or the build
folder MSDA_MM_MMCV_CUDA names ('0' turns it off).  With compiled mmcv, or
without a CUDA device, nothing changes (see mmcv_cuda_switch).
"""
import os

from .mmcv_cuda_switch import ENV, switch_on_request

KERNELS = switch_on_request(os.environ.get(ENV) or "1")
