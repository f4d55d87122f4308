"""Per-link probabilities: the number each link gets, and the two text forms that carry them.

The numbers come from the word-level soft alignments of the run (aligner.extract.inference.
soft_alignments: the matrices ``align extract --soft`` writes, source–target orientation,
summed over the other side's subwords and pooled over a word's own, by their maximum or mean:
``--subword-pooling``, aligner.extract.inference.word_matrix):

* ``--direction fwd``: ``fwd[i, j]`` = p(source word i | target word j) of the model
  p(target | source); ``--direction rev``: ``rev[i, j]`` = p(target word j | source word i).
* ``--direction both -H soft-average``: ``(fwd[i, j] + rev[i, j]) / 2``, the symmetrized
  posterior that soft-average compares with the line's threshold (``--threshold``; with a
  mixture, aligner/extract/mixture.py, the mix of both models' thresholds): every link written
  is above it.
* ``--direction both`` with a Moses heuristic (grow-diag, ...): both directions' numbers,
  ``fwd[i, j],rev[i, j]`` (a link the heuristic took from one direction can be improbable in
  the other).

Two forms, both line-aligned with the Pharaoh output and in its link order (sorted by source,
then target index):

* a probabilities file (``align extract --link-probs FILE``, as awesome-align's
  ``--output_prob_file``): one token per link, separated by spaces, e.g. ``0.9731 0.4410``
  (``0.9731,0.8802`` for a Moses heuristic); an empty line where the Pharaoh line is empty;
* inline (``align extract --inline-probs``): ``i-j:p`` tokens in the Pharaoh line itself,
  e.g. ``0-0:0.9731 1-2:0.4410``, which ``align score-aer`` reads (ignoring the numbers unless
  it sweeps a threshold).

Numbers are written with :data:`DECIMALS` decimals. A token's *score* (what a threshold
sweep compares) is the mean of its numbers: for a Moses heuristic's ``pf,pr`` the same
symmetrized posterior as soft-average's. No torch here.
"""
from __future__ import annotations

import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from aligner.formats import parse_links, read_lines, tokenize_line
from aligner.links.combine import needs_soft
from aligner.utils import AlignerError, check_condition

Link = Tuple[int, int]
#: a link with its numbers (one, or fwd and rev for a Moses heuristic)
Scored = Tuple[Link, Tuple[float, ...]]
DECIMALS = 4
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_NUMBERS = re.compile(rf"{_NUMBER}(?:,{_NUMBER})*")
_SCORED_LINK = re.compile(rf"([0-9]+)-([0-9]+)(?::({_NUMBER}(?:,{_NUMBER})*))?")


def link_numbers(links: Iterable[Link], matrices: Mapping[str, np.ndarray], direction: str,
                 heuristic: Optional[str]) -> List[Scored]:
    """The links of one pair, sorted as Pharaoh writes them, each with its numbers.

    `matrices`: the pair's word-level soft alignments by direction ("fwd", "rev"; source
    words × target words); `direction`: fwd, rev or both; `heuristic`: the symmetrization of
    ``both`` (see the module docstring for which number each case gets).
    """
    scored = []
    # soft-average's number: the mean it compared with its threshold
    mean = direction == "both" and heuristic is not None and needs_soft(heuristic)
    for i, j in sorted(set(links)):
        if direction != "both":
            numbers: Tuple[float, ...] = (float(matrices[direction][i, j]),)
        elif mean:
            numbers = ((float(matrices["fwd"][i, j]) + float(matrices["rev"][i, j])) / 2.0,)
        else:
            numbers = (float(matrices["fwd"][i, j]), float(matrices["rev"][i, j]))
        scored.append(((i, j), numbers))
    return scored


def _format_numbers(numbers: Sequence[float]) -> str:
    return ",".join(f"{min(max(p, 0.0), 1.0):.{DECIMALS}f}" for p in numbers)


def format_numbers(scored: Sequence[Scored]) -> str:
    """A probabilities-file line: one token per link (``0.9731 0.4410``)."""
    return " ".join(_format_numbers(numbers) for _, numbers in scored)


def format_inline(scored: Sequence[Scored]) -> str:
    """A Pharaoh line with inline numbers: ``0-0:0.9731 1-2:0.4410``."""
    return " ".join(f"{i}-{j}:{_format_numbers(numbers)}" for (i, j), numbers in scored)


def parse_scored_links(text: str, name: str, line_no: int) -> Dict[Link, Optional[float]]:
    """One Pharaoh line whose links may carry numbers (``i-j`` or ``i-j:p`` or
    ``i-j:pf,pr``) -> {link: score (the mean of its numbers) or None}.

    A plain Pharaoh line takes the fast path of :func:`aligner.formats.parse_links`; a
    malformed token raises AlignerError "name:line: malformed link '...'".
    """
    if ":" not in text:
        return dict.fromkeys(parse_links(text, name, line_no))
    links: Dict[Link, Optional[float]] = {}
    for token in tokenize_line(text):
        match = _SCORED_LINK.fullmatch(token)
        if match is None:
            raise AlignerError(f"{name}:{line_no}: malformed link '{token}' (expected i-j or "
                               "i-j:p)")
        i, j, numbers = match.groups()
        links[(int(i), int(j))] = _score(numbers, token, name, line_no)
    return links


def _score(numbers: Optional[str], token: str, name: str, line_no: int) -> Optional[float]:
    if numbers is None:
        return None
    values = [float(p) for p in numbers.split(",")]
    check_condition(all(0.0 <= p <= 1.0 for p in values),
                    f"{name}:{line_no}: probability outside [0, 1] in '{token}'")
    return sum(values) / len(values)


def read_scored_alignments(path: str, probs: Optional[str] = None, reverse: bool = False
                           ) -> List[Dict[Link, Optional[float]]]:
    """A Pharaoh file whose links may carry inline numbers, one {link: score or None} per
    line, source–target (``reverse``: the file is target–source, flipped here).

    `probs`: a probabilities file line-aligned with `path` (one token per link, in the
    order of the links on the Pharaoh line, as ``align extract --link-probs`` and
    awesome-align write it); its scores replace any inline ones. Errors name the file and
    line: different line counts, a token count that differs from the line's link count, a
    malformed number.
    """
    alignments = []
    lines = read_lines(path)
    prob_lines = read_lines(probs) if probs is not None else None
    if prob_lines is not None:
        check_condition(len(prob_lines) == len(lines),
                        f"{probs}:{min(len(lines), len(prob_lines)) + 1}: line counts differ: "
                        f"{path} has {len(lines)} lines, {probs} has {len(prob_lines)}")
    for line_no, line in enumerate(lines, start=1):
        links = parse_scored_links(line, path, line_no)
        if prob_lines is not None:
            links = _with_probs_line(line, prob_lines[line_no - 1], path, probs, line_no)
        if reverse:
            links = {(j, i): p for (i, j), p in links.items()}
        alignments.append(links)
    return alignments


def _with_probs_line(line: str, probs_line: str, path: str, probs: str,
                     line_no: int) -> Dict[Link, Optional[float]]:
    """The links of a Pharaoh line in their written order, each with its token of the
    probabilities file's line."""
    tokens, numbers = tokenize_line(line), tokenize_line(probs_line)
    check_condition(len(tokens) == len(numbers),
                    f"{probs}:{line_no}: {len(numbers)} probabilities for the {len(tokens)} "
                    f"links of {path}:{line_no}")
    links: Dict[Link, Optional[float]] = {}
    for token, number in zip(tokens, numbers):
        match = _SCORED_LINK.fullmatch(token)
        if match is None:
            raise AlignerError(f"{path}:{line_no}: malformed link '{token}' (expected i-j)")
        if _NUMBERS.fullmatch(number) is None:
            raise AlignerError(f"{probs}:{line_no}: malformed probability '{number}'")
        links[(int(match.group(1)), int(match.group(2)))] = _score(number, number, probs,
                                                                     line_no)
    return links


def links_only(alignments: Sequence[Mapping[Link, Optional[float]]]) -> List[Set[Link]]:
    """The link sets of scored alignments (the numbers dropped)."""
    return [set(links) for links in alignments]


def check_scored(alignments: Sequence[Mapping[Link, Optional[float]]], name: str) -> None:
    """Raise AlignerError (naming the first line) unless every link has a score."""
    for line_no, links in enumerate(alignments, start=1):
        missing = [link for link, p in links.items() if p is None]
        check_condition(not missing, f"{name}:{line_no}: link '{missing[0][0]}-"
                                     f"{missing[0][1]}' has no probability (write i-j:p, or "
                                     "give --link-probs)" if missing else "")



def output_lines(alignments: Sequence[Iterable[Link]],
                 soft: Optional[Mapping[str, Sequence[np.ndarray]]], direction: str,
                 heuristic: Optional[str], inline: bool = False
                 ) -> Tuple[List[str], Optional[List[str]]]:
    """The lines `align extract` writes for a run's alignments: (Pharaoh lines, with ``i-j:p``
    tokens when `inline`; probabilities-file lines, or None without `soft`), each ending in
    ``\\n``. `soft`: {direction: word-level matrix per line} of the same run."""
    from aligner.formats import format_links

    if soft is None:
        check_condition(not inline, "inline probabilities need the soft alignments")
        return [format_links(links) + "\n" for links in alignments], None
    pharaoh, numbers = [], []
    for k, links in enumerate(alignments):
        scored = link_numbers(links, {d: m[k] for d, m in soft.items()}, direction, heuristic)
        pharaoh.append((format_inline(scored) if inline
                        else " ".join(f"{i}-{j}" for (i, j), _ in scored)) + "\n")
        numbers.append(format_numbers(scored) + "\n")
    return pharaoh, numbers
