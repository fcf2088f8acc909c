"""Whether one recipe's runs score as another's: rank statistics for the few
runs (seeds) per recipe that training budgets allow, exact where they can be.

For a baseline's values x (m runs) and a candidate's y (n runs):

- Mann-Whitney's U: the pairs (x_i, y_j) with y_j > x_i, a tie counting 1/2.
- Its one-sided p-value for "the candidate scores lower": the share of the
  C(m + n, n) splits of the pooled values into groups of those sizes whose U
  is at most the observed one (exact, ties included: the permutation
  distribution of the values seen), or past ``MAX_SPLITS`` splits the normal
  approximation with the tie correction and a continuity correction.
- The Hodges-Lehmann shift: the median of the m * n differences y_j - x_i,
  and the distribution-free interval between two of their order statistics,
  the tightest whose exact coverage (for values without ties) reaches the
  level asked, or all of them where none does, with that coverage.
"""
from __future__ import annotations

import itertools
import math
import statistics
from typing import Sequence

from scipy.stats import mannwhitneyu, rankdata

# Past this many splits of the pooled runs, the p-value is the normal
# approximation's (a million splits take about a second).
MAX_SPLITS = 1_000_000


def mann_whitney_u(baseline: Sequence[float], candidate: Sequence[float]) -> float:
    """The pairs in which the candidate's value is above the baseline's, ties 1/2."""
    return float(mannwhitneyu(candidate, baseline).statistic)


def p_lower(baseline: Sequence[float], candidate: Sequence[float]) -> tuple[float, str]:
    """One-sided p-value that the candidate scores lower than the baseline,
    and how it was computed ("exact" or "normal")."""
    m, n = len(baseline), len(candidate)
    if not m or not n:
        raise ValueError(f"each group needs a run: {m} baseline and {n} candidate runs")
    if math.comb(m + n, n) > MAX_SPLITS:
        return float(mannwhitneyu(candidate, baseline, alternative="less",
                                  method="asymptotic").pvalue), "normal"
    # scipy's exact method assumes no ties: the splits are counted here, on mid-ranks.
    observed = mann_whitney_u(baseline, candidate)
    ranks = rankdata([*baseline, *candidate]).tolist()
    offset = n * (n + 1) / 2  # U = the candidate's rank sum minus this
    splits = at_most = 0
    for chosen in itertools.combinations(ranks, n):
        splits += 1
        at_most += sum(chosen) - offset <= observed + 1e-9
    return at_most / splits, "exact"


def u_null_counts(m: int, n: int) -> list[int]:
    """How many of the C(m + n, n) orderings of m baseline and n candidate
    values (no ties) give U = 0, 1, ..., m * n: the largest value is a
    candidate's (above all m baseline values) or a baseline's (above none of
    the candidate's)."""
    table = {(0, j): [1] for j in range(n + 1)}
    table.update({(i, 0): [1] for i in range(m + 1)})
    for i in range(1, m + 1):
        for j in range(1, n + 1):
            counts = [0] * (i * j + 1)
            for u, c in enumerate(table[(i, j - 1)]):
                counts[u + i] += c
            for u, c in enumerate(table[(i - 1, j)]):
                counts[u] += c
            table[(i, j)] = counts
    return table[(m, n)]


def shift_interval(baseline: Sequence[float], candidate: Sequence[float],
                   level: float = 0.9) -> dict:
    """The Hodges-Lehmann shift of the candidate from the baseline, and the
    interval [D_(k), D_(mn + 1 - k)] of the sorted differences D with the
    largest k whose coverage 1 - 2 P(U <= k - 1) is at least ``level`` (k = 1,
    all of them, where none is), with its coverage."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    m, n = len(baseline), len(candidate)
    if not m or not n:
        raise ValueError(f"each group needs a run: {m} baseline and {n} candidate runs")
    diffs = sorted(y - x for x in baseline for y in candidate)
    counts = u_null_counts(m, n)
    total = math.comb(m + n, n)
    k, below = 1, 0  # below: the orderings with U <= k - 2
    while k + 1 <= (m * n + 1) / 2 and (
            1 - 2 * (below + counts[k - 1] + counts[k]) / total >= level):
        below += counts[k - 1]
        k += 1
    coverage = 1 - 2 * (below + counts[k - 1]) / total
    return dict(shift=statistics.median(diffs), low=diffs[k - 1], high=diffs[-k],
                coverage=coverage)
