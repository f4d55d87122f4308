"""The bitext's lines joined end to end in runs of consecutive lines: the text that the
teacher, the self-training rounds and their guides train on (``--join-lines``), while the
output aligns every line as given.

A neural model with absolute positions and a softmax over the source aligns lines much longer
than those it trained on badly: on ja-en, trained on short everyday sentences, its recall on
40-word Wikipedia lines fell to a third of the classical teacher's
(eval/results/join_lines_jaen.md). Training on runs of joined lines shows every stage lines
as long as the longest it will align, also where most of the bitext's lines are short.

The runs: in corpus order, each run's length n is drawn uniformly from 1..``most`` (numpy's
PCG64 seeded with the run's seed, a stream of its own), cut short before the next line would
take either side of the run above ``max_words`` words; a line with an empty side, or one
already above ``max_words`` on a side, stays alone. Every line is in exactly one run, so
a pass over the joined text passes over every line once; only the lines' lengths change.
The runs are a function of the bitext's word counts, ``most``, ``max_words`` and the seed.
"""
from __future__ import annotations

import math
from typing import Iterable, Iterator, List, Sequence, Tuple

import numpy as np

from aligner.formats import PairsSide

#: the random stream of the runs, apart from the samples' and the batches'
_STREAM = 2_000_003


def run_sizes(lengths: Iterable[Tuple[int, int]], most: int, max_words: int,
              seed: int) -> np.ndarray:
    """Lines per run, in corpus order (int64, summing to the number of lines), for the
    (source words, target words) counts `lengths` of every line (module docstring)."""
    counts = np.asarray(list(lengths), dtype=np.int64).reshape(-1, 2)
    rng = np.random.Generator(np.random.PCG64([seed, _STREAM]))
    wanted = rng.integers(1, most + 1, size=len(counts))   # one draw per run at most
    sizes: List[int] = []
    start, n_lines = 0, len(counts)

    def alone(k: int) -> bool:
        return bool(counts[k].min() == 0 or counts[k].max() > max_words)

    while start < n_lines:
        size, src, tgt = 1, int(counts[start, 0]), int(counts[start, 1])
        if not alone(start):
            while (size < wanted[len(sizes)] and start + size < n_lines
                   and not alone(start + size)
                   and src + counts[start + size, 0] <= max_words
                   and tgt + counts[start + size, 1] <= max_words):
                src += int(counts[start + size, 0])
                tgt += int(counts[start + size, 1])
                size += 1
        sizes.append(size)
        start += size
    return np.asarray(sizes, dtype=np.int64)


class JoinedBitext:
    """A bitext (a Bitext, BitextFiles, or any re-iterable of (source words, target words)
    with ``source_name`` / ``target_name``) seen as runs of its lines joined end to end
    (`sizes`: lines per run, :func:`run_sizes`). Iterating gives each run's (source words,
    target words), reading the underlying bitext once per pass; ``len()`` is the number of
    runs; ``pairs_at`` takes 0-based run indices. ``firsts[k]``: the 0-based line of run k's
    first line (``firsts[-1]``: the number of lines)."""

    def __init__(self, bitext, sizes: np.ndarray, description: str = ""):
        self.bitext = bitext
        self.firsts = np.zeros(len(sizes) + 1, dtype=np.int64)
        self.firsts[1:] = np.cumsum(sizes)
        self.source_name, self.target_name = bitext.source_name, bitext.target_name
        self.description = description
        self.n_lines = int(self.firsts[-1])

    def __iter__(self) -> Iterator[Tuple[List[str], List[str]]]:
        pairs = iter(self.bitext)
        for k in range(len(self)):
            src: List[str] = []
            tgt: List[str] = []
            for _ in range(int(self.firsts[k + 1] - self.firsts[k])):
                s, t = next(pairs)
                src += s
                tgt += t
            yield src, tgt

    def pairs_at(self, runs: Sequence[int]) -> Iterator[Tuple[List[str], List[str]]]:
        """(source words, target words) of the 0-based `runs` (strictly increasing), in
        order, from one pass that stops after the last of them."""
        wanted = iter(runs)
        following = next(wanted, None)
        previous = -1
        if following is None:
            return
        for k, pair in enumerate(self):
            if k == following:
                yield pair
                previous, following = following, next(wanted, None)
                if following is None:
                    return
                if following <= previous:
                    raise ValueError(f"pairs_at: runs must increase ({previous}, {following})")
        raise ValueError(f"pairs_at: run {following} is past the end")

    def __len__(self) -> int:
        return len(self.firsts) - 1

    @property
    def source(self) -> PairsSide:
        return PairsSide(self, 0)

    @property
    def target(self) -> PairsSide:
        return PairsSide(self, 1)


def join_bitext(bitext, most: int, max_words: int, seed: int):
    """`bitext` itself when `most` <= 1, else its :class:`JoinedBitext` (one pass to count
    the words of every line)."""
    if most <= 1:
        return bitext
    sizes = run_sizes(((len(s), len(t)) for s, t in bitext), most, max_words, seed)
    return JoinedBitext(bitext, sizes, f"{len(bitext)} lines joined in {len(sizes)} runs of "
                                       f"1-{most} (at most {max_words} words a side)")


def joined_round_pairs(round_pairs: int, joined) -> int:
    """A round's sample in runs: `round_pairs` lines' worth of `joined`'s runs (its mean run
    length), so that joining keeps a round's lines, not multiplies them (0: all)."""
    if round_pairs <= 0 or not isinstance(joined, JoinedBitext) or len(joined) == 0:
        return round_pairs
    return max(1, math.ceil(round_pairs * len(joined) / joined.n_lines))


def lines_as_given(bitext):
    """The bitext whose lines `bitext` joins (`bitext` itself when it joins none)."""
    return bitext.bitext if isinstance(bitext, JoinedBitext) else bitext
