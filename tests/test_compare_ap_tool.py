"""tools/compare_ap.py and bench/step/ap_stats.py: the rank statistics,
unpaired and paired, against values worked by hand, by brute force and by
scipy, and the tool on hand-written mmengine logs, with the errors for bad
input."""
import itertools
import json
import math
import subprocess
import sys

import pytest
from tool_runs import ROOT, write_run

from bench.step import ap_stats
from bench.step.ap_stats import (
    mann_whitney_u,
    p_lower,
    paired_p_lower,
    paired_shift_interval,
    shift_interval,
    signed_rank,
    signed_rank_null_counts,
    u_null_counts,
)


def test_u_counts_the_candidate_above_with_ties_as_halves():
    assert mann_whitney_u([1.0, 2.0], [3.0, 4.0, 5.0]) == 6
    assert mann_whitney_u([3.0, 4.0], [1.0, 4.0]) == 1.5  # 4 > 3, and 4 = 4


def test_null_counts_are_the_orderings_of_each_u():
    assert u_null_counts(2, 2) == [1, 1, 2, 1, 1]
    for m, n in [(1, 4), (3, 4), (5, 2)]:
        counts = u_null_counts(m, n)
        assert sum(counts) == math.comb(m + n, n) and len(counts) == m * n + 1
        # By brute force: every placement of the candidate's ranks among 1..m+n.
        brute = [0] * (m * n + 1)
        for ranks in itertools.combinations(range(1, m + n + 1), n):
            brute[sum(ranks) - n * (n + 1) // 2] += 1
        assert counts == brute


def test_the_exact_p_value_counts_the_splits():
    # All three candidates below both baseline runs: 1 split of C(5, 3) = 10.
    assert p_lower([3.0, 4.0], [0.0, 1.0, 2.0]) == (0.1, "exact")
    assert p_lower([0.0, 1.0], [2.0, 3.0, 4.0]) == (1.0, "exact")
    # Ties: the pooled values 1, 2, 2, 3 (U = 0.5 observed); of the C(4, 2) = 6
    # splits, the candidate taking the 1 and either 2 gives U = 0.5: 2 of 6.
    assert p_lower([2.0, 3.0], [1.0, 2.0]) == (pytest.approx(2 / 6), "exact")


def test_past_the_exact_limit_the_normal_approximation_is_close(monkeypatch):
    baseline = [80.0 + 0.3 * i for i in range(8)]
    candidate = [79.5 + 0.3 * i for i in range(8)]
    exact, method = p_lower(baseline, candidate)
    monkeypatch.setattr(ap_stats, "MAX_SPLITS", 0)
    normal, approximated = p_lower(baseline, candidate)
    assert (method, approximated) == ("exact", "normal")
    assert normal == pytest.approx(exact, abs=0.02)


def test_the_shift_interval_has_its_exact_coverage():
    control, graphed = [82.4, 82.3], [79.3, 79.9, 80.4, 80.2, 78.3]
    result = shift_interval(control, graphed, level=0.9)
    # 2 against 5 runs: only the widest interval reaches 0.9 (1 - 2 / 21).
    assert result["coverage"] == pytest.approx(19 / 21)
    assert result["low"] == pytest.approx(78.3 - 82.4) and result["high"] == pytest.approx(-1.9)
    assert result["shift"] == pytest.approx(-2.45)
    # More runs: a tighter interval, still at least the level.
    wide = shift_interval(list(range(10)), [v + 0.5 for v in range(10)], level=0.9)
    assert 0.9 <= wide["coverage"] < 0.95 and wide["low"] < 0.5 < wide["high"]
    with pytest.raises(ValueError, match="level"):
        shift_interval(control, graphed, level=1.0)
    with pytest.raises(ValueError, match="each group needs a run"):
        p_lower([], graphed)


def test_signed_rank_null_counts_are_the_subset_sums():
    assert signed_rank_null_counts(3) == [1, 1, 1, 2, 1, 1, 1]
    n = 6
    brute = [0] * (n * (n + 1) // 2 + 1)
    for signs in itertools.product((0, 1), repeat=n):
        brute[sum(rank for rank, sign in zip(range(1, n + 1), signs) if sign)] += 1
    assert signed_rank_null_counts(n) == brute


def test_the_paired_p_value_counts_the_sign_assignments():
    # Four pairs, every candidate below its baseline: 1 of 16 assignments.
    assert paired_p_lower([-2.5, -2.1, -0.5, -1.2]) == (1 / 16, "exact")
    # Ties share mid-ranks, zeros drop out: brute force over the signs.
    differences = [-1.0, 1.0, -2.0, 0.0, -2.0, 0.5]
    observed, ranks = signed_rank(differences)
    assert ranks == [2.5, 2.5, 4.5, 4.5, 1.0] and observed == 3.5
    brute = [sum(itertools.compress(ranks, signs)) <= observed
             for signs in itertools.product((0, 1), repeat=len(ranks))]
    assert paired_p_lower(differences)[0] == pytest.approx(sum(brute) / len(brute))
    # Without ties, scipy's exact signed-rank test.
    from scipy.stats import wilcoxon
    no_ties = [-1.3, 0.4, -2.2, -0.7, 1.1, -0.2, -3.0]
    assert paired_p_lower(no_ties)[0] == pytest.approx(
        wilcoxon(no_ties, alternative="less", method="exact").pvalue)
    assert paired_p_lower([0.0, 0.0]) == (1.0, "exact")
    with pytest.raises(ValueError, match="paired runs need a pair"):
        paired_p_lower([])


def test_the_paired_shift_interval_has_its_exact_coverage():
    four = paired_shift_interval([-2.5, -2.1, -0.5, -1.2], level=0.9)
    # 4 pairs: only the widest interval of the 10 Walsh averages, at 1 - 2 / 16.
    assert four == dict(shift=pytest.approx(-1.575), low=-2.5, high=-0.5,
                        coverage=pytest.approx(0.875))
    twelve = [0.1 * i - 0.35 for i in range(12)]
    wide = paired_shift_interval(twelve, level=0.9)
    assert 0.9 <= wide["coverage"] < 0.95 and wide["low"] < 0.2 < wide["high"]
    # Its coverage: the share of sign assignments with W+ outside the tails it cuts.
    counts = signed_rank_null_counts(12)
    walsh = sorted((a + b) / 2 for i, a in enumerate(twelve) for b in twelve[i:])
    k = walsh.index(wide["low"]) + 1
    assert wide["coverage"] == pytest.approx(1 - 2 * sum(counts[:k]) / 2 ** 12)
    with pytest.raises(ValueError, match="level"):
        paired_shift_interval(twelve, level=0.0)


def _tool(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "compare_ap.py"), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_tool_compares_two_groups_at_the_last_epoch(tmp_path):
    base = [write_run(tmp_path / f"b{i}", {10: 1.0}, {1: 0.5, 2: ap})
            for i, ap in enumerate([0.80, 0.81])]
    cand = [write_run(tmp_path / f"c{i}", {10: 1.0}, {1: 0.5, 2: ap})
            for i, ap in enumerate([0.78, 0.79, 0.795])]
    # A runs.json of compare_runs.py counts each of its runs.
    runs_json = tmp_path / "runs.json"
    runs_json.write_text(json.dumps(dict(runs=dict(x=dict(evals=[dict(epoch=2, bbox_mAP=79.0)])))))
    out = tmp_path / "cmp.json"
    result = _tool("eager=" + ",".join(map(str, base)),
                   "graphed=" + ",".join(map(str, cand[:2])) + f",{runs_json}",
                   "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "bbox_mAP at epoch 2" in result.stdout
    assert "graphed: 78.0 79.0 79.0  (mean 78.67, 78.0-79.0)" in result.stdout
    report = json.loads(out.read_text())
    assert report["u"] == 0 and report["p_candidate_lower"] == pytest.approx(0.1)
    assert report["p_method"] == "exact" and report["shift"]["shift"] == pytest.approx(-2.0)
    assert f"{runs_json}:x" in report["runs"]["graphed"]


def test_tool_compares_paired_runs(tmp_path):
    base = [write_run(tmp_path / f"b{i}", {10: 1.0}, {2: ap}) for i, ap in enumerate([0.80, 0.82])]
    cand = [write_run(tmp_path / f"c{i}", {10: 1.0}, {2: ap}) for i, ap in enumerate([0.79, 0.83])]
    out = tmp_path / "cmp.json"
    result = _tool("eager=" + ",".join(map(str, base)), "graphed=" + ",".join(map(str, cand)),
                   "--paired", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "paired, the i-th run with the i-th: differences -1.0 +1.0" in result.stdout
    paired = json.loads(out.read_text())["paired"]
    assert paired["w_plus"] == 1.5 and paired["w_max"] == 3.0
    assert paired["p_candidate_lower"] == pytest.approx(0.75)
    assert paired["differences"] == [pytest.approx(-1.0), pytest.approx(1.0)]
    uneven = _tool("eager=" + ",".join(map(str, base)), f"graphed={cand[0]}", "--paired")
    assert uneven.returncode != 0 and "Traceback" not in uneven.stderr
    assert "--paired needs as many graphed runs as eager runs, got 1 and 2" in uneven.stderr


@pytest.mark.parametrize("args, message", [
    (["a=x"], "the following arguments are required"),
    (["a", "b=y"], "expected NAME=PATH[,PATH ...]"),
    (["a=x", "a=y"], "two names"),
    (["a=x", "b=y", "--level", "1.5"], "--level must be in (0, 1)"),
    (["a=missing", "b=y"], "missing: no such work_dir or file"),
])
def test_bad_input_is_named(args, message, tmp_path):
    result = _tool(*args, cwd=tmp_path)
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr


def test_a_run_without_the_epoch_is_named(tmp_path):
    short = write_run(tmp_path / "short", {10: 1.0}, {1: 0.5})
    full = write_run(tmp_path / "full", {10: 1.0}, {1: 0.5, 2: 0.6})
    result = _tool(f"a={full}", f"b={short}")
    assert result.returncode != 0
    assert f"no evaluation at epoch 2 in {short} (last: 1)" in result.stderr
    assert _tool(f"a={full}", f"b={short}", "--epoch", "1").returncode == 0
