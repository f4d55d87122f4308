"""Training units made of consecutive training pairs joined end to end: lines as long as the
longest the model will align, also where the bitext's own lines are short.

A neural model with absolute positions and a softmax over the source aligns lines much longer
than those it trained on badly (eval/results/join_lines_jaen.md: on ja-en, trained on short
everyday sentences, its recall on 40-word Wikipedia lines fell to a third of the classical
teacher's, while it matched the teacher on short lines). With ``join_lines`` = N > 1 the
trainer sees the encoded corpus as *units*: a run of n consecutive pairs (in corpus order)
concatenated, source after source and target after target, n drawn uniformly from 1..N per
unit, as long as the unit's longer side stays within the corpus's ``max_len`` subwords. The
guide links of a unit are its pairs' links shifted by the subwords before them. Every pair is
in exactly one unit, so an epoch still passes over every training pair once; only the lines'
lengths (and so the batches) change. The units are a function of the seed and the corpus:
a resumed run sees the same ones.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from aligner.data import EncodedCorpus
from aligner.training.guidance import GuideLinks

#: the random stream of the units, apart from the batches' (TokenBatcher uses [seed, epoch])
_STREAM = 1_000_003


def unit_sizes(src_lengths: Sequence[int], tgt_lengths: Sequence[int], most: int,
               max_len: int, seed: int) -> np.ndarray:
    """Pairs per unit, in corpus order (int64, summing to the number of pairs): each drawn
    from 1..`most`, cut short where the next pair would take a side of the unit above
    `max_len` subwords (0: no limit)."""
    count = len(src_lengths)
    rng = np.random.default_rng([seed, _STREAM])
    wanted = rng.integers(1, most + 1, size=count)   # at most one draw per unit is used
    sizes: List[int] = []
    start = 0
    while start < count:
        size, src, tgt = 1, int(src_lengths[start]), int(tgt_lengths[start])
        while (size < wanted[len(sizes)] and start + size < count
               and (max_len <= 0 or max(src + int(src_lengths[start + size]),
                                        tgt + int(tgt_lengths[start + size])) <= max_len)):
            src += int(src_lengths[start + size])
            tgt += int(tgt_lengths[start + size])
            size += 1
        sizes.append(size)
        start += size
    return np.asarray(sizes, dtype=np.int64)


class JoinedCorpus:
    """An :class:`aligner.data.EncodedCorpus` seen as units of joined pairs (the trainer's
    interface: ``source(k)``, ``target(k)``, ``src_lengths``, ``tgt_lengths``, ``len()``,
    ``directory``). ``firsts[k]``: the unit's first pair; unit k is pairs firsts[k] ..
    firsts[k+1]-1."""

    def __init__(self, corpus: EncodedCorpus, sizes: np.ndarray):
        self.corpus = corpus
        self.firsts = np.zeros(len(sizes) + 1, dtype=np.int64)
        self.firsts[1:] = np.cumsum(sizes)
        self.directory = corpus.directory
        self.stats = corpus.stats
        self.src_lengths = np.add.reduceat(corpus.src_lengths, self.firsts[:-1]) \
            if len(sizes) else np.zeros(0, dtype=np.int64)
        self.tgt_lengths = np.add.reduceat(corpus.tgt_lengths, self.firsts[:-1]) \
            if len(sizes) else np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.firsts) - 1

    def pairs(self, k: int) -> range:
        """The corpus pairs of unit k."""
        return range(int(self.firsts[k]), int(self.firsts[k + 1]))

    def source(self, k: int) -> np.ndarray:
        return np.concatenate([self.corpus.source(i) for i in self.pairs(k)])

    def target(self, k: int) -> np.ndarray:
        return np.concatenate([self.corpus.target(i) for i in self.pairs(k)])


class JoinedGuides:
    """The guide links of a :class:`JoinedCorpus`'s units: ``pair(k)`` (n, 2) (source
    subword, target subword), each pair's links shifted by the subwords before it."""

    def __init__(self, guides: GuideLinks, corpus: JoinedCorpus):
        self.guides, self.corpus = guides, corpus

    def pair(self, k: int) -> np.ndarray:
        parts, src_shift, tgt_shift = [], 0, 0
        for i in self.corpus.pairs(k):
            parts.append(self.guides.pair(i) + np.array([src_shift, tgt_shift],
                                                        dtype=np.int64))
            src_shift += int(self.corpus.corpus.src_lengths[i])
            tgt_shift += int(self.corpus.corpus.tgt_lengths[i])
        return np.concatenate(parts) if parts else np.zeros((0, 2), dtype=np.int64)


def training_units(corpus: EncodedCorpus, join_lines: int, seed: int):
    """What the trainer trains on: `corpus` itself (join_lines 1), else its
    :class:`JoinedCorpus` of units of 1..join_lines pairs within the corpus's max_len."""
    if join_lines <= 1:
        return corpus
    max_len = int(corpus.stats.max_len) if corpus.stats is not None else 0
    return JoinedCorpus(corpus, unit_sizes(corpus.src_lengths, corpus.tgt_lengths, join_lines,
                                           max_len, seed))


def open_guides(corpus) -> Optional[object]:
    """The guide links of the trainer's corpus (an EncodedCorpus or a JoinedCorpus), or None
    when the encoded corpus has none."""
    if isinstance(corpus, JoinedCorpus):
        guides = GuideLinks.open(corpus.directory, len(corpus.corpus))
        return None if guides is None else JoinedGuides(guides, corpus)
    return GuideLinks.open(corpus.directory, len(corpus))
