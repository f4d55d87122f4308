"""Soft-average thresholds per line length, calibrated on the model's own posteriors: the
output decision of the recipe, which needs no gold alignment of the language pair.

One threshold on the mean of the two directions' posteriors, chosen on en-fr dev, keeps
almost no link of the lines where the model's posteriors spread over several words: lines
far longer than those it mostly trained on, distant languages (eval/results/
calibrated_thresholds.md: ja-en recall 16 %). How far they spread is measured on the
bitext itself. Each length bucket gets the threshold that maximizes the *expected*
F-measure of its links, the posteriors taken as the links' probabilities
(minimum-Bayes-risk decoding, Kumar & Byrne 2002; Matusov et al. 2004 for symmetrized
posteriors), approximated by the ratio of expectations over the bucket: keeping the links
with p >= t gives

    E[F_beta](t)  ≈  (1 + beta²) · S(t) / (N(t) + beta² · P)

with S(t) the sum and N(t) the number of the kept posteriors and P the sum of all of them
(the expected number of true links). The output's threshold for bucket k is the base
threshold (recipe.THRESHOLD, or --threshold) times t_k / t_0: the shortest lines keep the
base, longer ones get a threshold as much lower as their posteriors are more spread. (The
expected-F thresholds alone, without the base, lose on a gold of sure links only: de-en
bicici100 17.3 against 16.6; calibrated_thresholds.md.)

A bucket's posteriors are kept as a histogram (:class:`Histogram`: BINS bins of [0, 1], a
count and a sum per bin). Buckets: a line's length is max(source words, target words), cut
at :data:`BUCKET_EDGES`; a bucket with fewer than MIN_LINES calibration lines takes the
threshold of all buckets pooled. Only numpy is needed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, Sequence, Tuple

import numpy as np

from aligner.utils import check_condition

#: a line of max(I, J) words goes into bucket k: the number of edges <= max(I, J)
BUCKET_EDGES: Tuple[int, ...] = (15, 25, 40)
#: histogram bins over [0, 1]
BINS = 500
#: a bucket's own threshold needs at least this many lines; else the pooled one
MIN_LINES = 20
#: no threshold above this (a threshold of 1 or more keeps no link)
MAX_THRESHOLD = 0.99


def bucket_of(n_source: int, n_target: int, edges: Sequence[int] = BUCKET_EDGES) -> int:
    """The length bucket of a line of `n_source` and `n_target` words."""
    return int(np.searchsorted(np.asarray(edges), max(n_source, n_target), side="right"))


@dataclass
class Histogram:
    """Posteriors of one bucket: ``counts[k]`` and ``sums[k]`` of the values in bin k
    ([k/BINS, (k+1)/BINS), the last bin closed), over ``lines`` lines."""

    counts: np.ndarray
    sums: np.ndarray
    lines: int = 0

    @classmethod
    def empty(cls, bins: int = BINS) -> "Histogram":
        return cls(np.zeros(bins, dtype=np.int64), np.zeros(bins, dtype=np.float64), 0)

    def add(self, posteriors: np.ndarray) -> None:
        """Count one line's posteriors (any shape, values in [0, 1])."""
        values = np.clip(np.asarray(posteriors, dtype=np.float64).ravel(), 0.0, 1.0)
        bins = np.minimum((values * len(self.counts)).astype(np.int64), len(self.counts) - 1)
        self.counts += np.bincount(bins, minlength=len(self.counts))
        self.sums += np.bincount(bins, weights=values, minlength=len(self.counts))
        self.lines += 1

    def merged(self, other: "Histogram") -> "Histogram":
        return Histogram(self.counts + other.counts, self.sums + other.sums,
                         self.lines + other.lines)

    def threshold(self, beta: float) -> float:
        """The lower edge of the bin from which on keeping every posterior maximizes the
        expected F_beta (module docstring); 1.0 (keep nothing) without posteriors."""
        total = float(self.sums.sum())
        if total <= 0.0:
            return 1.0
        kept_sum = np.cumsum(self.sums[::-1])          # bins from the top down
        kept_count = np.cumsum(self.counts[::-1])
        b2 = beta * beta
        with np.errstate(invalid="ignore", divide="ignore"):
            expected_f = np.where(kept_count > 0,
                                  (1 + b2) * kept_sum / (kept_count + b2 * total), 0.0)
        best = int(np.argmax(expected_f))              # bins top..top-best are kept
        return (len(self.counts) - 1 - best) / len(self.counts)

    def to_dict(self) -> Dict[str, Any]:
        return {"lines": self.lines, "counts": self.counts.tolist(),
                "sums": [round(float(s), 6) for s in self.sums]}

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "Histogram":
        counts = np.asarray(values["counts"], dtype=np.int64)
        sums = np.asarray(values["sums"], dtype=np.float64)
        check_condition(counts.shape == sums.shape and counts.ndim == 1 and len(counts) > 0,
                        "calibration: counts and sums must be lists of one length")
        return cls(counts, sums, int(values.get("lines", 0)))


@dataclass
class LengthThresholds:
    """A soft-average threshold per length bucket (:func:`bucket_of`): ``values[k]`` for
    bucket k of ``edges``."""

    edges: Tuple[int, ...]
    values: Tuple[float, ...]

    def for_shape(self, n_source: int, n_target: int) -> float:
        return self.values[bucket_of(n_source, n_target, self.edges)]

    def describe(self) -> str:
        bounds = [0, *self.edges]
        names = [f"{lo}-{hi - 1}" for lo, hi in zip(bounds, bounds[1:])] + [f"{bounds[-1]}+"]
        return ", ".join(f"{name} words {value:.3f}" for name, value in zip(names, self.values))

    def to_dict(self) -> Dict[str, Any]:
        return {"edges": list(self.edges), "values": list(self.values)}


class Calibration:
    """Histograms of the soft-averaged posteriors per length bucket, from the lines of a
    calibration sample (:meth:`add`), and the thresholds they give (:meth:`thresholds`)."""

    def __init__(self, edges: Sequence[int] = BUCKET_EDGES, bins: int = BINS):
        self.edges = tuple(int(e) for e in edges)
        self.histograms = [Histogram.empty(bins) for _ in range(len(self.edges) + 1)]

    def add(self, forward: np.ndarray, reverse: np.ndarray) -> None:
        """One line's two (I, J) soft alignments (aligner.links.soft_symmetrize's
        conventions); a line without elements is left out."""
        if np.size(forward) == 0 or np.size(reverse) == 0:
            return
        mean = (np.asarray(forward, dtype=np.float64) + np.asarray(reverse, dtype=np.float64)) / 2
        self.histograms[bucket_of(*mean.shape, self.edges)].add(mean)

    def add_lines(self, soft_pairs: Iterable[Tuple[np.ndarray, np.ndarray]]) -> None:
        for forward, reverse in soft_pairs:
            self.add(forward, reverse)

    def expected_f_thresholds(self, beta: float) -> Tuple[float, ...]:
        """Each bucket's expected-F_beta threshold; a bucket of fewer than MIN_LINES lines
        takes the pooled histogram's."""
        check_condition(beta > 0, f"beta must be > 0: {beta}")
        pooled = self.histograms[0]
        for histogram in self.histograms[1:]:
            pooled = pooled.merged(histogram)
        everything = pooled.threshold(beta)
        return tuple(h.threshold(beta) if h.lines >= MIN_LINES else everything
                     for h in self.histograms)

    def thresholds(self, base: float, beta: float) -> LengthThresholds:
        """`base` for the shortest lines (bucket 0), and for bucket k `base` times the ratio
        of bucket k's expected-F_beta threshold to bucket 0's, at most MAX_THRESHOLD: the
        threshold falls with the line length as the model's posteriors spread."""
        expected = self.expected_f_thresholds(beta)
        if expected[0] <= 0.0:
            return LengthThresholds(self.edges, tuple(base for _ in expected))
        return LengthThresholds(self.edges, tuple(
            min(MAX_THRESHOLD, base * value / expected[0]) for value in expected))

    def to_dict(self) -> Dict[str, Any]:
        return {"edges": list(self.edges), "histograms": [h.to_dict() for h in self.histograms]}

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "Calibration":
        calibration = cls(values["edges"], len(values["histograms"][0]["counts"]))
        check_condition(len(values["histograms"]) == len(calibration.edges) + 1,
                        "calibration: one histogram per bucket expected")
        calibration.histograms = [Histogram.from_dict(h) for h in values["histograms"]]
        return calibration
