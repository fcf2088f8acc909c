"""``SyntheticShapesDataset``: the synthetic shapes data as an mmdet dataset
that writes itself under ``data_root`` on first use."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from mmengine.logging import print_log

from .. import compat  # noqa: F401  (first: on mmcv-lite, mmdet imports only after it)

# isort: split
from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS

from .synthetic import CLASSES, PALETTE, ensure_generated
from .synthetic.writer import MARKER


@DATASETS.register_module()
class SyntheticShapesDataset(CocoDataset):
    """A ``CocoDataset`` over ``msda_mm.datasets.synthetic`` data.

    Args:
        synthetic_cfg: the generator's arguments, ``dict(num_train, num_val,
            size=(H, W), seed)``.  The train and val datasets of a config
            share one tree, so they must give the same.  If ``data_root``
            has no tree yet it is generated there (once, whatever the number
            of processes); if it holds one made with other arguments,
            building the dataset fails rather than train on other data.
        Other arguments as ``CocoDataset``; ``data_root`` is required.

    Loading fails with the file named, and how to regenerate the tree, if
    the annotations are truncated or corrupt or listed images are missing.
    """

    METAINFO = dict(classes=CLASSES, palette=PALETTE)

    def __init__(self, *args, synthetic_cfg: dict, **kwargs):
        self.synthetic_cfg = dict(synthetic_cfg)
        super().__init__(*args, **kwargs)

    def load_data_list(self) -> list[dict]:
        if not self.data_root:
            raise ValueError("SyntheticShapesDataset needs data_root: where the data is "
                             "(or will be generated)")
        # Said before taking the generation lock: a first run otherwise sits
        # silent for as long as the images take to draw.
        if not (Path(self.data_root) / MARKER).exists():
            print_log(f"Generating synthetic shapes data under {self.data_root} "
                      f"({self.synthetic_cfg}) ...", logger="current")
        start = time.perf_counter()
        if ensure_generated(self.data_root, **self.synthetic_cfg):
            print_log(f"Synthetic shapes data written in {time.perf_counter() - start:.1f}s",
                      logger="current")
        regenerate = f"delete {self.data_root} and run again to regenerate the synthetic data"
        try:
            data_list = super().load_data_list()
        except json.JSONDecodeError as error:
            raise ValueError(f"{self.ann_file} is truncated or corrupt ({error}): "
                             f"{regenerate}") from error
        # Here rather than when the loader reaches an image: a few us a file.
        missing = [d["img_path"] for d in data_list if not os.path.isfile(d["img_path"])]
        if missing:
            raise FileNotFoundError(f"{len(missing)} of the {len(data_list)} images listed in "
                                    f"{self.ann_file} are missing, the first {missing[:3]}: "
                                    f"{regenerate}")
        return data_list
