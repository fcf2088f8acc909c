"""The synthetic shapes generator and ``SyntheticShapesDataset``: determinism,
valid COCO, one writer among concurrent processes, first-use generation."""
import multiprocessing
from pathlib import Path

import numpy as np
import pytest
from mmengine.registry import init_default_scope
from pycocotools.coco import COCO

from msda_mm.datasets import SyntheticShapesDataset
from msda_mm.datasets.synthetic import SPLITS, ann_file, ensure_generated, generate
from msda_mm.datasets.synthetic.__main__ import main as cli_main

# isort: split
from mmdet.registry import DATASETS  # after msda_mm, whose mmcv-lite shims it needs

SMALL = dict(num_train=6, num_val=3, size=(64, 80))


def _tree(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    generate(root, seed=0, workers=3, **SMALL)
    return root


def test_same_seed_same_bytes(tree, tmp_path):
    # The fixture drew on several threads, the command line on one.
    cli_main(["--out", str(tmp_path), "--num-train", "6", "--num-val", "3", "--size", "64", "80",
              "--seed", "0", "--workers", "1"])
    assert _tree(tmp_path) == _tree(tree)


def test_other_seed_other_data(tree, tmp_path):
    generate(tmp_path, seed=1, **SMALL)
    ours, theirs = _tree(tree), _tree(tmp_path)
    assert ours.keys() == theirs.keys()
    differing = [k for k in ours if ours[k] != theirs[k]]
    assert "train/000000.png" in differing and ann_file("val") in differing


@pytest.mark.parametrize("split", SPLITS)
def test_annotations_are_valid_coco(tree, split):
    num = SMALL[f"num_{split}"]
    h, w = SMALL["size"]
    coco = COCO(str(tree / ann_file(split)))
    assert [c["name"] for c in coco.loadCats(sorted(coco.getCatIds()))] == \
        list(SyntheticShapesDataset.METAINFO["classes"])
    images = coco.loadImgs(coco.getImgIds())
    assert len(images) == num
    anns = coco.loadAnns(coco.getAnnIds())
    assert len({a["id"] for a in anns}) == len(anns)
    for img in images:
        assert (img["height"], img["width"]) == (h, w)
        assert (tree / split / img["file_name"]).is_file()
        # Every image shows at least one labelled shape.
        assert coco.getAnnIds(imgIds=img["id"])
    for a in anns:
        x, y, bw, bh = a["bbox"]
        assert a["area"] > 0 and bw > 0 and bh > 0
        assert 0 <= x and 0 <= y and x + bw <= w and y + bh <= h
        assert a["iscrowd"] == 0 and a["category_id"] in coco.getCatIds()


def test_concurrent_processes_generate_once(tree, tmp_path):
    # As DDP ranks do on first use: every process asks, exactly one writes.
    args = (str(tmp_path), SMALL["num_train"], SMALL["num_val"], SMALL["size"], 0)
    with multiprocessing.get_context("fork").Pool(3) as pool:
        wrote = pool.starmap(ensure_generated, [args] * 3)
    assert sorted(wrote) == [False, False, True]
    generated = {k: v for k, v in _tree(tmp_path).items() if not k.startswith(".generate")}
    assert generated == _tree(tree)


def test_other_arguments_are_refused(tree):
    with pytest.raises(ValueError, match="delete it or use another data_root"):
        ensure_generated(tree, seed=0, **dict(SMALL, num_train=7))


def test_dataset_generates_on_first_use(tmp_path):
    init_default_scope("mmdet")
    dataset = DATASETS.build(dict(
        type="SyntheticShapesDataset", data_root=str(tmp_path), ann_file=ann_file("train"),
        data_prefix=dict(img="train/"), pipeline=[], synthetic_cfg=dict(seed=0, **SMALL)))
    assert len(dataset) == SMALL["num_train"]
    labels = np.concatenate([[i["bbox_label"] for i in dataset.get_data_info(k)["instances"]]
                             for k in range(len(dataset))])
    assert labels.min() >= 0 and labels.max() < len(dataset.metainfo["classes"])
    assert (tmp_path / ann_file("val")).is_file()
