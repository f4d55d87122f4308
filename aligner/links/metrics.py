"""Alignment Error Rate (Och & Ney 2000, 2003) over per-sentence sufficient statistics.

For a hypothesis A and gold sure S ⊆ possible P, with counts summed over the corpus:

    precision = |A ∩ P| / |A|        recall = |A ∩ S| / |S|
    AER       = 1 − (|A ∩ S| + |A ∩ P|) / (|A| + |S|)
    F1        = 2 · precision · recall / (precision + recall)

This is exactly what lilt/alignment-scripts' ``aer.py`` computes. Values are fractions in
[0, 1]; the CLI prints percentages. Empty denominators follow the "nothing to get wrong" rule:
precision is 1 when |A| = 0, recall is 1 when |S| = 0, AER is 0 when |A| + |S| = 0, and F1 is
0 when precision + recall = 0. (So an empty hypothesis against a non-empty gold set scores
AER 1, recall 0, F1 0.)

This module does not import torch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List, Sequence, Set, Tuple

from aligner.formats import GoldAlignment
from aligner.utils import check_condition

Link = Tuple[int, int]


@dataclass(frozen=True)
class AERStats:
    """Sufficient statistics of one or more sentence pairs (counts of links)."""

    n_hyp: int = 0             # |A|
    n_sure: int = 0            # |S|
    n_possible: int = 0        # |P| (sure links included)
    hyp_and_sure: int = 0      # |A ∩ S|
    hyp_and_possible: int = 0  # |A ∩ P|

    def __add__(self, other: "AERStats") -> "AERStats":
        return AERStats(self.n_hyp + other.n_hyp, self.n_sure + other.n_sure,
                        self.n_possible + other.n_possible,
                        self.hyp_and_sure + other.hyp_and_sure,
                        self.hyp_and_possible + other.hyp_and_possible)


@dataclass(frozen=True)
class AERScore:
    """Scores (fractions in [0, 1]) and the link counts they were computed from."""

    aer: float
    precision: float
    recall: float
    f1: float
    n_hyp: int
    n_sure: int
    n_possible: int
    hyp_and_sure: int
    hyp_and_possible: int

    def as_dict(self) -> Dict[str, float]:
        """All fields as a plain dict (for JSON)."""
        return asdict(self)


def sentence_stats(hypothesis: Iterable[Link], gold: GoldAlignment) -> AERStats:
    """Counts of one sentence pair: |A|, |S|, |P|, |A ∩ S|, |A ∩ P|."""
    hyp: Set[Link] = set(hypothesis)
    possible = gold.possible | gold.sure  # S ⊆ P even if a caller built P without S
    return AERStats(n_hyp=len(hyp), n_sure=len(gold.sure), n_possible=len(possible),
                    hyp_and_sure=len(hyp & gold.sure), hyp_and_possible=len(hyp & possible))


def score_from_stats(stats: AERStats) -> AERScore:
    """Precision, recall, F1 and AER from summed counts (empty denominators: see module doc)."""
    precision = stats.hyp_and_possible / stats.n_hyp if stats.n_hyp else 1.0
    recall = stats.hyp_and_sure / stats.n_sure if stats.n_sure else 1.0
    denominator = stats.n_hyp + stats.n_sure
    aer = (1.0 - (stats.hyp_and_sure + stats.hyp_and_possible) / denominator
           if denominator else 0.0)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return AERScore(aer=aer, precision=precision, recall=recall, f1=f1, n_hyp=stats.n_hyp,
                    n_sure=stats.n_sure, n_possible=stats.n_possible,
                    hyp_and_sure=stats.hyp_and_sure, hyp_and_possible=stats.hyp_and_possible)


def corpus_stats(hypotheses: Sequence[Iterable[Link]],
                 golds: Sequence[GoldAlignment]) -> List[AERStats]:
    """Per-sentence statistics; hypotheses and golds must have the same length."""
    check_condition(len(hypotheses) == len(golds),
                    f"hypothesis has {len(hypotheses)} sentence pairs, gold has {len(golds)}")
    return [sentence_stats(hyp, gold) for hyp, gold in zip(hypotheses, golds)]


def sum_stats(stats: Iterable[AERStats]) -> AERStats:
    """Corpus counts: the element-wise sum of per-sentence counts."""
    total = AERStats()
    for sentence in stats:
        total = total + sentence
    return total


def score_aer(hypotheses: Sequence[Iterable[Link]], golds: Sequence[GoldAlignment]) -> AERScore:
    """Corpus-level AER, precision, recall and F1: counts summed over sentences, then divided."""
    return score_from_stats(sum_stats(corpus_stats(hypotheses, golds)))
