"""Write synthetic data sets before the runs that read them.

    python tools/prepare_data.py SOURCE [SOURCE ...]

Each SOURCE is a config (CONFIG.py: its train set, e.g. the synthetic
configs') or HxW (the H x W train set of tools/profile_step.py
--image-size H W).  A set already written is left as it is; runs started
afterwards neither race for the data nor time its drawing.
"""
from __future__ import annotations

import argparse
import re


def source(text: str) -> str:
    """argparse type: CONFIG.py or HxW."""
    if not (text.endswith(".py") or re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", text)):
        raise argparse.ArgumentTypeError(f"expected CONFIG.py or HxW, got {text!r}")
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", type=source, metavar="SOURCE",
                        help="a config file, or HxW")
    args = parser.parse_args(argv)
    # Here, after the command line is read: msda_mm (and with it torch) takes seconds.
    from mmengine.config import Config
    from profile_step_measure import synthetic_dataset

    from msda_mm.datasets.synthetic import ensure_generated

    for text in args.sources:
        dataset = (Config.fromfile(text).train_dataloader.dataset if text.endswith(".py")
                   else synthetic_dataset(*map(int, text.split("x"))))
        ensure_generated(dataset["data_root"], **dataset["synthetic_cfg"])


if __name__ == "__main__":
    main()
