"""research/weight_norms.py: the norms it reads from checkpoints and its own
JSON, and how it counts a lean against chance (CPU)."""
import json
import math

import pytest
import torch

from research.tests.tools import assert_usage_error, load


def test_compare_counts_the_cases_and_the_tensors_that_keep_one_sign():
    compare = load("weight_norms.py")["compare"]
    first = ({"w": 2.0, "b": 1.0, "z": 0.0}, {"w": 1.0, "b": 2.0, "z": 0.0})
    second = ({"w": 3.0, "b": 1.0, "z": 0.0}, {"w": 1.0, "b": 1.0, "z": 0.0})
    summary = compare([first, second])
    # "z" has no positive norm; "b" is below, then tied: no sign kept.
    assert summary["tensors"] == 2 and summary["cases"] == 4
    assert summary["a_larger"] == 2
    assert summary["one_sign_tensors"] == ["w"] and summary["one_sign_by_chance"] == 1.0
    assert summary["median_abs_log_ratio"] == pytest.approx(
        (math.log(2) + math.log(2)) / 2)  # |log| values: log 2, log 2, log 3, 0
    assert summary["model_norm_ratios"] == pytest.approx([1.0, math.sqrt(10 / 2)])


def test_compare_refuses_no_pairs_and_runs_without_a_shared_tensor():
    compare = load("weight_norms.py")["compare"]
    with pytest.raises(ValueError, match="at least one pair"):
        compare([])
    with pytest.raises(ValueError, match="no tensor of positive norm"):
        compare([({"a": 1.0}, {"b": 1.0})])


def test_checkpoint_norms_are_each_floating_tensors_and_saved_as_json(tmp_path):
    tool = load("weight_norms.py")
    state = {"w": torch.tensor([3.0, 4.0]), "h": torch.tensor([1.0], dtype=torch.bfloat16),
             "count": torch.tensor(7)}
    run = tmp_path / "graphed_seed1"
    run.mkdir()
    torch.save({"state_dict": state, "meta": {"epoch": 12}}, run / "epoch_12.pth")
    norms = tool["read_norms"](run / "epoch_12.pth", tmp_path / "norms")
    assert norms == {"w": 5.0, "h": 1.0}
    saved = tmp_path / "norms" / "graphed_seed1_epoch_12.json"
    assert json.loads(saved.read_text()) == norms
    assert tool["read_norms"](saved) == norms


def test_main_compares_the_pairs_and_writes_the_summary(tmp_path, capsys):
    for name, norms in [("a", {"w": 2.0}), ("b", {"w": 1.0})]:
        (tmp_path / f"{name}.json").write_text(json.dumps(norms))
    summary = load("weight_norms.py")["main"](
        ["--pair", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
         "--out", str(tmp_path / "out" / "summary.json")])
    assert summary["a_larger"] == 1 and summary["one_sign_tensors"] == ["w"]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["runs"] == [
        [str(tmp_path / "a.json"), str(tmp_path / "b.json")]]
    assert "A's norm larger in 1 of 1 cases" in capsys.readouterr().out


def test_a_file_without_norms_is_named(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(ValueError, match="empty.json: no floating tensors"):
        load("weight_norms.py")["read_norms"](empty)
    torch.save({"state_dict": {"count": torch.tensor(1)}}, tmp_path / "ints.pth")
    with pytest.raises(ValueError, match="ints.pth: no floating tensors"):
        load("weight_norms.py")["read_norms"](tmp_path / "ints.pth")


def test_a_pair_is_required(capsys):
    assert_usage_error("weight_norms.py", [], "--pair", capsys)
