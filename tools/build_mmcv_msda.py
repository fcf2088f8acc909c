"""Build mmcv's own CUDA kernels of multi-scale deformable attention for this
GPU, from your mmcv source distribution, for mmcv-lite installs.

    python tools/build_mmcv_msda.py --sdist mmcv-2.1.0.tar.gz [--build-dir DIR] [--force]
    python tools/build_mmcv_msda.py --download [--download-dir DIR] [--build-dir DIR]

--download fetches the sdist of the installed mmcv version with pip first.
Needs a CUDA build of torch, a GPU, a CUDA toolkit (nvcc, CUDA_HOME) and
ninja; takes about a minute.  The build lands in
~/.cache/msda_mm/mmcv_msda/<mmcv>-torch<torch>-sm<capability>/ unless
--build-dir says otherwise.  Then MSDA_MM_MMCV_CUDA=1 (or =DIR), or
custom_imports 'msda_mm.compat.with_mmcv_cuda' in a config, runs mmcv's
MultiScaleDeformableAttention on these kernels (msda_mm/compat/mmcv_cuda_switch.py).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# Runs as `python tools/build_mmcv_msda.py` from a checkout, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# mmcv_cuda_build.cache_root(), spelled for --help, which answers before
# mmcv and msda_mm (torch) load.
CACHE = "$XDG_CACHE_HOME (else ~/.cache)/msda_mm/mmcv_msda"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--sdist", type=Path, metavar="TAR_GZ",
                        help="mmcv's source distribution (mmcv-<installed version>.tar.gz)")
    source.add_argument("--download", action="store_true",
                        help="fetch the installed mmcv version's sdist with pip first")
    parser.add_argument("--download-dir", type=Path, metavar="DIR",
                        help=f"where --download puts the sdist (default: {CACHE})")
    parser.add_argument("--build-dir", type=Path, metavar="DIR",
                        help=f"build folder (default: one per mmcv, torch and GPU under {CACHE})")
    parser.add_argument("--force", action="store_true",
                        help="rebuild even if the folder holds a build of the same sdist")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # Here, after the command line is read: mmcv and msda_mm take seconds.
    import mmcv

    from msda_mm.compat import mmcv_cuda_build
    from msda_mm.compat.mmcv_sdist import SdistError, download_sdist

    try:
        sdist = args.sdist
        if args.download:
            print(f"Downloading mmcv {mmcv.__version__}'s sdist with pip ...", flush=True)
            sdist = download_sdist(mmcv.__version__,
                                   args.download_dir or mmcv_cuda_build.cache_root())
            print(f"  {sdist}")
        print(f"Building mmcv's MSDA kernels from {sdist} (about a minute) ...", flush=True)
        start = time.perf_counter()
        built = mmcv_cuda_build.build(sdist, args.build_dir, force=args.force)
        mmcv_cuda_build.load_extension(built.folder)  # loads here, or says why not
    except (SdistError, mmcv_cuda_build.BuildError) as e:
        raise SystemExit(f"error: {e}") from None
    m = built.manifest
    how = f"built in {time.perf_counter() - start:.0f} s" if built.compiled else \
        "an earlier build of the same sdist, reused (--force rebuilds)"
    print(f"mmcv {m.mmcv}'s MSDA kernels for torch {m.torch}, CUDA {m.cuda}, sm {m.capability}: "
          f"{how}\n  {built.library}")
    if args.build_dir is None:
        print("Use them with MSDA_MM_MMCV_CUDA=1, or custom_imports "
              "'msda_mm.compat.with_mmcv_cuda' in a config.")
    else:
        print(f"Use them with MSDA_MM_MMCV_CUDA={built.folder} (also with custom_imports "
              f"'msda_mm.compat.with_mmcv_cuda' in a config).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
