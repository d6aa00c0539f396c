"""Measures of sampling fairness (Har-Peled & Mahabadi, Section 5)."""

from __future__ import annotations

import math

import numpy as np


def tv_to_uniform(samples: np.ndarray, support: np.ndarray) -> float:
    """Total variation distance between the empirical distribution of ``samples`` and the uniform
    distribution on ``support``; samples outside the support count as mass off the support.

    >>> tv_to_uniform(np.array([0, 1, 0, 1]), np.array([0, 1]))
    0.0
    >>> tv_to_uniform(np.array([0, 0, 0, 0]), np.array([0, 1]))
    0.5
    """
    support = np.unique(support)
    samples = np.asarray(samples)
    if support.size == 0 or samples.size == 0:
        return float("nan")
    pos = np.searchsorted(support, samples)
    pos_c = np.minimum(pos, support.size - 1)
    inside = support[pos_c] == samples
    counts = np.bincount(pos_c[inside], minlength=support.size)
    emp = counts / samples.size
    off = 1.0 - float(inside.mean())
    return 0.5 * (float(np.abs(emp - 1.0 / support.size).sum()) + off)


def noise_floor(samples_per_point: float) -> float:
    """Expected TV of a perfect sampler with S samples per support point: sqrt(1 / (2 pi S)).

    >>> round(noise_floor(100), 4)
    0.0399
    """
    return math.sqrt(1.0 / (2.0 * math.pi * samples_per_point))


def chi_square_uniform(samples: np.ndarray, support: np.ndarray) -> tuple[float, int]:
    """Pearson chi-square statistic of ``samples`` against uniform on ``support``, and its dof."""
    support = np.unique(support)
    pos = np.searchsorted(support, samples)
    counts = np.bincount(pos, minlength=support.size).astype(float)
    expected = samples.size / support.size
    return float(((counts - expected) ** 2 / expected).sum()), int(support.size - 1)
