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

For runs paired (the i-th of each group shares a seed, so its initial
weights and data), the differences d_i = y_i - x_i:

- Wilcoxon's signed-rank W+: the sum of the mid-ranks of |d_i| over the
  positive d_i (zeros dropped), and its one-sided p-value that the
  candidate scores lower: the share of the 2^n sign assignments of those
  ranks whose W+ is at most the observed one (exact, ties included).
- The paired Hodges-Lehmann shift: the median of the Walsh averages
  (d_i + d_j) / 2, i <= j, with the interval between two of their order
  statistics chosen as above from W+'s distribution.
"""
from __future__ import annotations

import itertools
import math
import statistics
from typing import Sequence

from scipy.stats import mannwhitneyu, rankdata

# Past this many splits of the pooled runs (or sign assignments of paired
# differences), the p-value is the normal approximation's (a million take
# about a second).
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
    return order_interval(diffs, u_null_counts(m, n), math.comb(m + n, n), level)


def order_interval(values: Sequence[float], counts: Sequence[int], total: int,
                   level: float) -> dict:
    """The median of the sorted ``values`` and the interval [v_(k),
    v_(N + 1 - k)] with the largest k whose coverage 1 - 2 P(S <= k - 1) is
    at least ``level`` (k = 1 where none is), with its coverage: ``counts``
    the null distribution of the rank statistic S (the number of the
    ``total`` equally likely arrangements giving S = 0, 1, ...)."""
    k, below = 1, 0  # below: the arrangements with S <= k - 2
    while k + 1 <= (len(values) + 1) / 2 and (
            1 - 2 * (below + counts[k - 1] + counts[k]) / total >= level):
        below += counts[k - 1]
        k += 1
    coverage = 1 - 2 * (below + counts[k - 1]) / total
    return dict(shift=statistics.median(values), low=values[k - 1], high=values[-k],
                coverage=coverage)


def signed_rank_null_counts(n: int) -> list[int]:
    """How many of the 2^n sign assignments of the ranks 1..n give W+ = 0,
    1, ..., n(n + 1) / 2: the subsets of 1..n with each sum."""
    counts = [1]
    for rank in range(1, n + 1):
        grown = counts + [0] * rank
        for w, c in enumerate(counts):
            grown[w + rank] += c
        counts = grown
    return counts


def signed_rank(differences: Sequence[float]) -> tuple[float, list[float]]:
    """Wilcoxon's W+ of ``differences`` and the mid-ranks of the nonzero
    ones' sizes."""
    nonzero = [d for d in differences if d != 0]
    ranks = rankdata([abs(d) for d in nonzero]).tolist()
    return float(sum(r for r, d in zip(ranks, nonzero) if d > 0)), ranks


def paired_p_lower(differences: Sequence[float]) -> tuple[float, str]:
    """One-sided p-value that the candidate scores lower, from its paired
    ``differences`` (candidate minus baseline), and how it was computed
    ("exact" or "normal"; 1.0 where every difference is zero)."""
    if not differences:
        raise ValueError("paired runs need a pair")
    observed, ranks = signed_rank(differences)
    n = len(ranks)
    if n == 0:
        return 1.0, "exact"
    if 2 ** n > MAX_SPLITS:
        mean = sum(ranks) / 2
        sd = math.sqrt(sum(r * r for r in ranks) / 4)
        return statistics.NormalDist(mean, sd).cdf(observed + 0.5), "normal"
    at_most = sum(sum(itertools.compress(ranks, signs)) <= observed + 1e-9
                  for signs in itertools.product((0, 1), repeat=n))
    return at_most / 2 ** n, "exact"


def paired_shift_interval(differences: Sequence[float], level: float = 0.9) -> dict:
    """The paired Hodges-Lehmann shift of ``differences`` (the median of
    their Walsh averages) and its interval between two of those averages'
    order statistics, chosen by W+'s distribution (order_interval)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    n = len(differences)
    if not n:
        raise ValueError("paired runs need a pair")
    walsh = sorted((differences[i] + differences[j]) / 2
                   for i in range(n) for j in range(i, n))
    return order_interval(walsh, signed_rank_null_counts(n), 2 ** n, level)
