"""The synthetic shapes generator and ``SyntheticShapesDataset``: determinism,
valid COCO, one writer among concurrent processes, first-use generation,
folders it does not own left alone, damaged trees named."""
import contextlib
import io
import multiprocessing
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from mmengine.registry import init_default_scope
from pycocotools.coco import COCO

from msda_mm.datasets import SyntheticShapesDataset
from msda_mm.datasets.synthetic import SPLITS, ann_file, ensure_generated, generate
from msda_mm.datasets.synthetic.__main__ import main as cli_main
from msda_mm.datasets.synthetic.writer import CLAIM, LOCK, MARKER

# isort: split
from mmdet.registry import DATASETS  # after msda_mm, whose mmcv-lite shims it needs

SMALL = dict(num_train=6, num_val=3, size=(64, 80))
CLI_ARGS = ["--num-train", "6", "--num-val", "3", "--size", "64", "80", "--seed", "0"]


def _tree(root: Path) -> dict:
    """Every file but the lock (which only the locking writers leave)."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != LOCK}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    generate(root, seed=0, workers=3, **SMALL)
    return root


def test_same_seed_same_bytes(tree, tmp_path):
    # The fixture drew on several threads, the command line on one.
    cli_main(["--out", str(tmp_path), *CLI_ARGS, "--workers", "1"])
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
    assert _tree(tmp_path) == _tree(tree)


def _cli_output(out: str) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        cli_main(["--out", out, *CLI_ARGS])
    return printed.getvalue()


def test_two_command_lines_at_once_write_once(tree, tmp_path):
    """Guards: two ``python -m msda_mm.datasets.synthetic`` on one folder
    both wrote, through the same temporary names, and could crash half way;
    now one writes, the other waits for it and reuses the tree."""
    with multiprocessing.get_context("fork").Pool(2) as pool:
        printed = pool.map(_cli_output, [str(tmp_path)] * 2)
    assert sorted(p.split()[0] for p in printed) == [str(tmp_path), "wrote"], printed
    assert "already holds" in min(printed)
    assert _tree(tmp_path) == _tree(tree)


def test_another_writers_temporary_file_is_not_in_the_way(tree, tmp_path):
    """Guards: temporary names were shared (``<name>.tmp``): a writer met the
    other's file there.  Here that file is a folder, which fails any write
    over it; a stopped write (its claim left) is then done again."""
    (tmp_path / "train" / "000000.png.tmp").mkdir(parents=True)
    (tmp_path / CLAIM).touch()
    assert ensure_generated(tmp_path, seed=0, **SMALL)
    assert _tree(tmp_path) == _tree(tree)
    assert not (tmp_path / CLAIM).exists()


def test_a_folder_the_writer_does_not_own_is_left_alone(tmp_path, capsys):
    """Guards: a data_root holding someone else's COCO tree had its
    annotations/instances_train.json replaced; now no writer writes into a
    non-empty folder without its marker, and it says what it found."""
    theirs = tmp_path / ann_file("train")
    theirs.parent.mkdir()
    theirs.write_text('{"images": []}')
    expected = (rf"{re.escape(str(tmp_path))} is not empty and has no {re.escape(MARKER)} .*"
                r"found 'annotations'")
    for write in (lambda: ensure_generated(tmp_path, seed=0, **SMALL),
                  lambda: generate(tmp_path, seed=0, **SMALL)):
        with pytest.raises(ValueError, match=expected):
            write()
    with pytest.raises(SystemExit):
        cli_main(["--out", str(tmp_path), *CLI_ARGS])
    assert "found 'annotations'" in capsys.readouterr().err
    assert theirs.read_text() == '{"images": []}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["annotations"]


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


def _build_train_set(root: Path):
    init_default_scope("mmdet")
    return DATASETS.build(dict(
        type="SyntheticShapesDataset", data_root=str(root), ann_file=ann_file("train"),
        data_prefix=dict(img="train/"), pipeline=[], synthetic_cfg=dict(seed=0, **SMALL)))


def test_truncated_files_are_named_with_how_to_regenerate(tree, tmp_path):
    """Guards: a truncated annotations file or marker gave a bare
    JSONDecodeError, naming neither the file nor what to do."""
    root = tmp_path / "data"
    for damaged in (ann_file("train"), MARKER):
        shutil.copytree(tree, root)
        path = root / damaged
        path.write_bytes(path.read_bytes()[:-7])
        with pytest.raises(ValueError, match=rf"{re.escape(str(path))} is truncated or corrupt "
                                             rf".*delete {re.escape(str(root))} and run again"):
            _build_train_set(root)
        shutil.rmtree(root)


def test_missing_images_are_counted_when_the_dataset_loads(tree, tmp_path):
    """Guards: a missing image failed only when the loader reached it, maybe
    hours into training; now loading counts them and names the first."""
    root = tmp_path / "data"
    shutil.copytree(tree, root)
    for index in (1, 4):
        (root / "train" / f"00000{index}.png").unlink()
    with pytest.raises(FileNotFoundError,
                       match=r"2 of the 6 images listed in .*instances_train.json are missing, "
                             r"the first \[.*000001.png', .*000004.png'\]: delete"):
        _build_train_set(root)


@pytest.mark.parametrize("args, message", [
    (["--num-train", "-1"], "num_train must be a whole number of images >= 0, got -1"),
    (["--num-val", "-3"], "num_val must be a whole number of images >= 0, got -3"),
    (["--size", "16", "16"], r"at least 32 x 32, got \(16, 16\)"),
])
def test_bad_arguments_are_refused_before_anything_is_written(tmp_path, capsys, args, message):
    out = tmp_path / "new"
    with pytest.raises(SystemExit):
        cli_main(["--out", str(out), *CLI_ARGS, *args])
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists()


def test_a_file_in_the_way_is_named(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for out, message in ((afile, "is a file, not a folder"),
                         (afile / "sub", "cannot make the synthetic data folder")):
        with pytest.raises(SystemExit):
            cli_main(["--out", str(out), *CLI_ARGS])
        err = capsys.readouterr().err
        assert str(out) in err and message in err, err
    assert afile.read_text() == "mine"


def test_a_folder_it_may_not_write_is_named(tmp_path, monkeypatch):
    # Root ignores permission bits, so the refusal is the file system's stand-in.
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(ValueError, match=f"cannot make the synthetic data folder {tmp_path}/new: "
                                         "Permission denied"):
        ensure_generated(tmp_path / "new", seed=0, **SMALL)
    monkeypatch.undo()
    monkeypatch.setattr("builtins.open", refuse)
    with pytest.raises(ValueError, match=f"cannot write into the synthetic data folder "
                                         f"{tmp_path}: Permission denied"):
        ensure_generated(tmp_path, seed=0, **SMALL)
