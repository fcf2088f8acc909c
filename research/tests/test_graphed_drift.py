"""research/graphed_drift.py: the learning rate it sets and its summary
(CPU)."""
import pytest
import torch

from research.tests.tools import assert_usage_error, load


def test_learning_rate_warms_up_linearly_then_drops_by_ten():
    factor = load("graphed_drift.py")["lr_factor"]
    assert factor(0, 100, None) == pytest.approx(0.001)
    assert factor(50, 100, None) == pytest.approx(0.5005)
    assert factor(100, 100, 150) == 1.0
    assert factor(150, 100, 150) == pytest.approx(0.1)
    assert factor(0, 0, None) == 1.0


def row(step, graphed_norm, eager_norm):
    log = lambda norm: dict(loss=2.0, grad_norm=norm)  # noqa: E731
    return dict(step=step, update_graphed_vs_eager=0.2, update_eager_vs_eager=0.1,
                buffers_graphed_vs_eager=0.4, buffers_eager_vs_eager=0.3,
                update_along_graphed=-0.01 * (step % 2), update_along_eager=0.0,
                graphed=log(graphed_norm), eager=log(eager_norm), eager_again=log(eager_norm))


def test_summary_gives_windows_and_the_parameters_furthest_above_the_floor():
    rows = [row(i, 1.1, 1.0) for i in range(60)]
    summary = load("graphed_drift.py")["summarize"](
        rows, ["a", "b"], torch.tensor([6.0, 60.0]), torch.tensor([6.0, 6.0]))
    first, second = summary["windows"]
    assert first["steps"] == [0, 49] and second["steps"] == [50, 59]
    assert first["grad_norm_graphed_over_eager"] == pytest.approx(1.1)
    assert first["grad_norm_eager_over_eager"] == 1.0
    assert first["update_graphed_vs_eager"] == 0.2 and first["update_eager_vs_eager"] == 0.1
    assert first["buffers_graphed_vs_eager"] == 0.4 and first["buffers_eager_vs_eager"] == 0.3
    # Signed: a mean, which keeps a bias's sign where a median may not.
    assert first["update_along_graphed"] == pytest.approx(-0.005)
    assert first["update_along_eager"] == 0.0
    furthest = summary["parameters_furthest_above_floor"]
    assert [p["name"] for p in furthest] == ["b", "a"]
    assert furthest[0]["mean_graphed_vs_eager"] == pytest.approx(1.0)


def test_bad_command_lines_are_refused(capsys):
    assert_usage_error("graphed_drift.py", ["c.py", "--warmup-iters", "-1"], "must be >= 0",
                       capsys)
