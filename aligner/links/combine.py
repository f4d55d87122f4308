"""One function that combines the two directions' alignments of every line by a heuristic.

Two kinds of heuristic combine the forward model p(target | source) ("fwd") with the reverse
model p(source | target) ("rev"):

* the Moses heuristics (``intersect``, ``union``, ``grow-diag``, ``grow-diag-final``,
  ``grow-diag-final-and``; aligner.links.symmetrize) take each direction's *hard* links: per line a
  set of ``(i, j)`` links;
* ``soft-average`` (aligner.links.soft_symmetrize) takes each direction's *soft* alignment: per line
  a float (I, J) matrix, and links ``(i, j)`` where the mean of the two exceeds a threshold.

:func:`needs_soft` says which of the two a heuristic takes, so that a caller computes only
that; :func:`combine` does the combination. Conventions throughout: source–target
orientation, I source words and J target words, i = 0-based source word, j = 0-based target
word (a reverse alignment is already flipped to source–target). No torch here.
"""
from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from aligner import constants as C
from aligner.links.soft_symmetrize import DEFAULT_THRESHOLD, soft_average_corpus
from aligner.links.symmetrize import symmetrize_corpus
from aligner.utils import AlignerError, check_condition

Link = Tuple[int, int]
#: every heuristic :func:`combine` knows: the Moses heuristics, then soft-average
KNOWN_HEURISTICS: Tuple[str, ...] = C.HEURISTICS + C.SOFT_HEURISTICS


def check_heuristic(heuristic: str) -> None:
    """AlignerError "unknown heuristic 'x' (choose from ...)" unless `heuristic` is known."""
    if heuristic not in KNOWN_HEURISTICS:   # (the message is built only when needed)
        raise AlignerError(f"unknown heuristic '{heuristic}' (choose from "
                           f"{', '.join(KNOWN_HEURISTICS)})")


def needs_soft(heuristic: str) -> bool:
    """Whether `heuristic` combines the two directions' soft (I, J) matrices (soft-average:
    True) or their hard link sets (a Moses heuristic: False). AlignerError if it is unknown."""
    check_heuristic(heuristic)
    return heuristic in C.SOFT_HEURISTICS


def combine(heuristic: str, threshold: Any = DEFAULT_THRESHOLD,
            hard: Optional[Mapping[str, Sequence[Set[Link]]]] = None,
            soft: Optional[Mapping[str, Sequence[np.ndarray]]] = None) -> List[Set[Link]]:
    """The two directions' alignments of every line combined by `heuristic`: one set of
    0-based source–target ``(i, j)`` links per line, in line order.

    hard: ``{"fwd": [...], "rev": [...]}``, each direction's links of every line, one set of
        ``(i, j)`` per line (source word i, target word j, both directions source–target);
        what a Moses heuristic needs (aligner.links.symmetrize).
    soft: ``{"fwd": [...], "rev": [...]}``, each direction's word-level soft alignment of every
        line, one (I, J) array per line for I source and J target words: ``fwd[i, j]`` =
        p(source word i | target word j), ``rev[i, j]`` = p(target word j | source word i)
        (aligner.extract.inference.soft_alignments, what ``align extract --soft`` writes); what
        soft-average needs (aligner.links.soft_symmetrize), with `threshold` (a number, per
        line length, or one per line: soft_average_corpus; ignored otherwise).

    Only the input the heuristic needs (:func:`needs_soft`) is read; other keys of the
    mappings are ignored. AlignerError, in one line, for an unknown heuristic, a needed input
    missing, two directions with different numbers of lines, or (soft-average) a line whose
    two matrices differ in shape.
    """
    if needs_soft(heuristic):
        check_condition(soft is not None and "fwd" in soft and "rev" in soft,
                        f"heuristic '{heuristic}' combines the two directions' soft "
                        f"alignments: give soft={{'fwd': ..., 'rev': ...}}")
        return soft_average_corpus(soft["fwd"], soft["rev"], threshold)  # type: ignore[index]
    check_condition(hard is not None and "fwd" in hard and "rev" in hard,
                    f"heuristic '{heuristic}' combines the two directions' links: give "
                    f"hard={{'fwd': ..., 'rev': ...}}")
    return symmetrize_corpus(hard["fwd"], hard["rev"], heuristic)  # type: ignore[index]
