"""The statistics the experiments report: rank correlations per example, and ranges over seeds.

    spearman(a, b)   Spearman's rho: Pearson's correlation of the ranks (ties share a rank)
    kendall(a, b)    Kendall's tau-b: concordant minus discordant pairs, corrected for ties

Both come from scipy.stats. A constant input has no ranking, so its correlation is undefined:
both return nan, and ``mean_defined`` averages the defined ones and says how many there were.
"""

from __future__ import annotations

import math
import warnings

import numpy as np


def _checked(a, b) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"rank correlation of {a.size} values against {b.size}")
    return a, b


def spearman(a, b) -> float:
    """Spearman's rank correlation of two equally long vectors (nan if either is constant)."""
    from scipy.stats import spearmanr

    return _rank_correlation(spearmanr, a, b)


def kendall(a, b) -> float:
    """Kendall's tau-b of two equally long vectors (nan if either is constant)."""
    from scipy.stats import kendalltau

    return _rank_correlation(kendalltau, a, b)


def _rank_correlation(test, a, b) -> float:
    """``test(a, b).statistic`` (a scipy rank test), nan where a vector is constant or short."""
    a, b = _checked(a, b)
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(test(a, b).statistic)


def mean_defined(values) -> tuple[float, int]:
    """(mean of the values that are not nan, how many there were); (nan, 0) if none."""
    v = np.asarray([x for x in values if not math.isnan(x)], dtype=np.float64)
    return (float(v.mean()), int(v.size)) if v.size else (math.nan, 0)


def spread(values) -> dict:
    """min, mean and max of per-seed values (nan ones left out), and how many seeds."""
    v = [float(x) for x in values if not math.isnan(float(x))]
    if not v:
        return {"min": math.nan, "mean": math.nan, "max": math.nan, "n": 0}
    return {"min": min(v), "mean": sum(v) / len(v), "max": max(v), "n": len(v)}
