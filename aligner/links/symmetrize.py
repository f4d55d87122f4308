"""Symmetrization of two directional alignments (Och & Ney 2003; Koehn et al. 2005).

Both inputs are sets of ``(i, j)`` links in source–target orientation: ``forward`` from the
model p(target | source), ``reverse`` from p(source | target), already flipped to source–target.

The heuristics follow fast_align's ``atools -c`` (the Moses-compatible reference), including
the order in which candidate links are visited, so results agree with it link for link:

* ``intersect``: F ∩ R.  ``union``: F ∪ R.
* ``grow-diag``: start from F ∩ R. Repeat passes over the candidates (F ∪ R) \\ (F ∩ R) in
  ascending (i, j) order; a candidate is added when one of its 8 neighbours (horizontal,
  vertical, diagonal) is already in the alignment and at least one of its two words is still
  unaligned. Additions take effect immediately within a pass; passes repeat until one adds
  nothing.
* ``grow-diag-final``: grow-diag, then one pass over F and then one over R (ascending order):
  add a link when at least one of its words is unaligned.
* ``grow-diag-final-and``: the same final passes, but only when both words are unaligned.

Sentence lengths are not needed: a neighbour outside the sentence is never in F ∪ R.

aligner.links.combine chooses between these and soft-average (aligner.links.soft_symmetrize) for
every caller: use its ``combine`` to combine two directions by a heuristic named by the user.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Set, Tuple

from aligner.utils import AlignerError

Link = Tuple[int, int]
Alignment = Set[Link]

NEIGHBOURS = ((1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, 1), (1, -1), (-1, -1))


class _Grower:
    """An alignment under construction with the set of aligned source and target words."""

    def __init__(self, links: Iterable[Link]):
        self.links: Alignment = set()
        self.aligned_src: Set[int] = set()
        self.aligned_tgt: Set[int] = set()
        for link in links:
            self.add(link)

    def add(self, link: Link) -> None:
        self.links.add(link)
        self.aligned_src.add(link[0])
        self.aligned_tgt.add(link[1])

    def one_unaligned(self, link: Link) -> bool:
        """At least one of the two words of ``link`` is unaligned."""
        return link[0] not in self.aligned_src or link[1] not in self.aligned_tgt

    def both_unaligned(self, link: Link) -> bool:
        """Neither word of ``link`` is aligned."""
        return link[0] not in self.aligned_src and link[1] not in self.aligned_tgt

    def touches(self, link: Link) -> bool:
        """One of the 8 neighbours of ``link`` is in the alignment."""
        i, j = link
        return any((i + di, j + dj) in self.links for di, dj in NEIGHBOURS)

    def grow_diag(self, candidates: Alignment) -> None:
        """Add neighbouring candidates until a full pass adds nothing (see module docstring)."""
        pending = sorted(candidates - self.links)
        while pending:
            remaining = []
            for link in pending:
                if self.one_unaligned(link) and self.touches(link):
                    self.add(link)
                else:
                    remaining.append(link)
            if len(remaining) == len(pending):
                break
            pending = remaining

    def final(self, directional: Alignment, both: bool) -> None:
        """One ascending pass adding links of ``directional`` that cover an unaligned word."""
        condition = self.both_unaligned if both else self.one_unaligned
        for link in sorted(directional):
            if link not in self.links and condition(link):
                self.add(link)


def intersect(forward: Alignment, reverse: Alignment) -> Alignment:
    """Links in both directions."""
    return set(forward) & set(reverse)


def union(forward: Alignment, reverse: Alignment) -> Alignment:
    """Links in either direction."""
    return set(forward) | set(reverse)


def grow_diag(forward: Alignment, reverse: Alignment) -> Alignment:
    """Intersection grown towards the union through neighbouring links."""
    grower = _Grower(intersect(forward, reverse))
    grower.grow_diag(union(forward, reverse))
    return grower.links


def _grow_diag_final(forward: Alignment, reverse: Alignment, both: bool) -> Alignment:
    """grow-diag, then the forward and then the reverse links that cover an unaligned word
    (`both`: whose two words are both unaligned)."""
    grower = _Grower(intersect(forward, reverse))
    grower.grow_diag(union(forward, reverse))
    grower.final(set(forward), both=both)
    grower.final(set(reverse), both=both)
    return grower.links


def grow_diag_final(forward: Alignment, reverse: Alignment) -> Alignment:
    """grow-diag, then directional links that cover at least one unaligned word."""
    return _grow_diag_final(forward, reverse, both=False)


def grow_diag_final_and(forward: Alignment, reverse: Alignment) -> Alignment:
    """grow-diag, then directional links whose two words are both unaligned."""
    return _grow_diag_final(forward, reverse, both=True)


HEURISTICS: Dict[str, Callable[[Alignment, Alignment], Alignment]] = {
    "intersect": intersect,
    "union": union,
    "grow-diag": grow_diag,
    "grow-diag-final": grow_diag_final,
    "grow-diag-final-and": grow_diag_final_and,
}


def symmetrize(forward: Alignment, reverse: Alignment, heuristic: str) -> Alignment:
    """Combine two source–target link sets of one sentence pair with a named heuristic."""
    try:
        function = HEURISTICS[heuristic]
    except KeyError:
        raise AlignerError(f"unknown symmetrization heuristic '{heuristic}' "
                           f"(expected one of {', '.join(HEURISTICS)})") from None
    return function(forward, reverse)


def symmetrize_corpus(forward: List[Alignment], reverse: List[Alignment],
                      heuristic: str) -> List[Alignment]:
    """Symmetrize sentence by sentence; both lists must have one entry per sentence pair."""
    if len(forward) != len(reverse):
        raise AlignerError(f"forward and reverse alignments differ in length: "
                           f"{len(forward)} and {len(reverse)} sentence pairs")
    return [symmetrize(fwd, rev, heuristic) for fwd, rev in zip(forward, reverse)]
