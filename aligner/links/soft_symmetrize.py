"""Symmetrization of two directions' soft alignments by averaging them (posterior decoding).

The Moses heuristics (aligner.links.symmetrize) see only each direction's hard links. A method that
gives a probability per link (HMM posteriors, attention, the alignment layer) can instead be
combined before any decision is taken, as in posterior decoding of the HMM (Liang, Taskar &
Klein 2006, "Alignment by agreement", §4: link where the posterior exceeds a threshold) with
the two directions averaged (the "soft union" of DeNero & Macherey 2011):

    link (i, j)  ⇔  ( p_fwd(i | j) + p_rev(j | i) ) / 2  >  threshold

Conventions (the same as ``align extract --soft``): both matrices are word level and in
source–target orientation, shape (I, J) for I source and J target words:

* ``forward[i, j]`` = p(source word i | target word j) of the model p(target | source): each
  column is a distribution over source words (it may sum to less than 1 when the model
  also aligns to NULL/EOS, and to more where target word j has several subwords pooled by
  their maximum: aligner.extract.inference.word_matrix).
* ``reverse[i, j]`` = p(target word j | source word i) of the model p(source | target): each
  row is a distribution over target words (likewise).

The threshold trades precision for recall. At the default 0.5 a link is kept when the two
directions together call it more likely than not; a word can still get several links (two
source words that both put most of their probability on one target word, as the reverse
direction allows, while the forward direction splits that word's column between them).
Only numpy is needed. aligner.links.combine chooses between this and the Moses heuristics for every
caller (``combine``, ``needs_soft``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, List, Sequence, Set, Tuple, Union

import numpy as np

from aligner.constants import SOFT_HEURISTICS  # noqa: F401  (re-exported)
from aligner.utils import AlignerError

if TYPE_CHECKING:
    from aligner.links.calibration import LengthThresholds

Link = Tuple[int, int]

DEFAULT_THRESHOLD = 0.5

#: a threshold: one number for every line, or one per line length
#: (aligner.links.calibration.LengthThresholds: anything with ``for_shape(I, J)``)
Threshold = Union[float, "LengthThresholds"]


def line_threshold(threshold: Threshold, n_source: int, n_target: int) -> float:
    """The threshold of a line of `n_source` and `n_target` words."""
    if hasattr(threshold, "for_shape"):
        return float(threshold.for_shape(n_source, n_target))  # type: ignore[union-attr]
    return float(threshold)   # type: ignore[arg-type]


def threshold_record(threshold: Threshold) -> object:
    """`threshold` as JSON records it: the number, or the thresholds per line length as a
    dict (their ``to_dict``)."""
    if hasattr(threshold, "to_dict"):
        return threshold.to_dict()   # type: ignore[union-attr]
    return float(threshold)   # type: ignore[arg-type]


def soft_average(forward: np.ndarray, reverse: np.ndarray,
                 threshold: Threshold = DEFAULT_THRESHOLD) -> Set[Link]:
    """Links (i, j) whose mean of ``forward[i, j]`` and ``reverse[i, j]`` exceeds ``threshold``
    (a number, or per line length: :func:`line_threshold`).

    forward, reverse: (I, J) arrays, source–target orientation (see the module docstring).
    Returns a set of 0-based (source word, target word) links. The comparison is strict. A
    matrix without elements (a line that gets no alignment: an empty side, or a pair too long
    for a model, aligner.extract.inference.no_alignment) gives no links, whatever the other's shape.
    """
    if np.size(forward) == 0 or np.size(reverse) == 0:
        return set()
    forward = np.asarray(forward, dtype=np.float64)
    reverse = np.asarray(reverse, dtype=np.float64)
    if forward.shape != reverse.shape or forward.ndim != 2:
        raise AlignerError(f"soft alignments of the two directions differ in shape: "
                           f"{forward.shape} and {reverse.shape} (expected the same (source "
                           f"words, target words))")
    rows, cols = np.nonzero((forward + reverse) / 2.0 > line_threshold(threshold,
                                                                       *forward.shape))
    return {(int(i), int(j)) for i, j in zip(rows, cols)}


def soft_average_corpus(forward: Sequence[np.ndarray], reverse: Sequence[np.ndarray],
                        threshold: Union[Threshold, Sequence[float]] = DEFAULT_THRESHOLD
                        ) -> List[Set[Link]]:
    """``soft_average`` sentence by sentence; one matrix per sentence pair in each list.
    `threshold`: one for every line (a number, or per line length), or a list of one number
    per line (a mixture's, aligner.extract.mixture.Mixture.thresholds)."""
    if len(forward) != len(reverse):
        raise AlignerError(f"forward and reverse soft alignments differ in length: "
                           f"{len(forward)} and {len(reverse)} sentence pairs")
    if isinstance(threshold, (list, tuple)):
        if len(threshold) != len(forward):
            raise AlignerError(f"{len(threshold)} thresholds for {len(forward)} sentence pairs")
        return [soft_average(f, r, t) for f, r, t in zip(forward, reverse, threshold)]
    return [soft_average(f, r, threshold) for f, r in zip(forward, reverse)]
