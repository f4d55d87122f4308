"""Which lines of the bitext each self-training round trains on: a training budget that stops
growing with the corpus.

With ``round_pairs`` = S below the bitext's N lines, round r (1-based) trains on S lines and
the round before it aligns only those S lines to guide it, so a round costs the same at 25k
and at 4M pairs. ``fine_tune_share`` = f is the share of the bitext a fine-tuned round
(2, 3, ...) trains on, at most S: round 1 trains new weights, the rounds after it only
fine-tune them and need fewer lines. Round r's size is s(1) = min(S, N), s(r) = min(S, N,
ceil(f·N)) for r > 1 (S = 0: no cap; f = 1: every round as round 1). The samples are
consecutive windows of one permutation of the line indices (numpy's PCG64 seeded with the
run's seed), taken cyclically::

    perm = permutation(N)                  # line indices 0..N-1, shuffled once
    start(r) = (s(1) + ... + s(r-1)) mod N
    sample(r) = sorted(perm[start(r) : start(r) + s(r)])   # wrapping around perm

so the rounds see distinct lines until the corpus is used up (min(s(1) + ... + s(R), N)
distinct lines in R rounds) and a sample never holds a line twice. A sample keeps the
bitext's order. A round whose size is N trains on the whole bitext (round 1 of the 25k
benchmark with S = 40,000).

:class:`SampledBitext` is the sample as a bitext (iterating reads the underlying bitext and
keeps the sample's lines): training, its resume checks and the guides' alignment take it as
they take the whole one.
"""
from __future__ import annotations

import math
from typing import Iterator, List, Optional, Tuple

import numpy as np

from aligner.formats import PairsSide


def round_size(n_lines: int, round_pairs: int, round_number: int,
               fine_tune_share: float = 1.0) -> int:
    """s(r) of the module docstring: the lines round `round_number` trains on."""
    size = n_lines if round_pairs <= 0 else min(round_pairs, n_lines)
    if round_number > 1:
        size = min(size, max(1, math.ceil(fine_tune_share * n_lines)))
    return size


def sample_lines(n_lines: int, round_pairs: int, seed: int, round_number: int,
                 fine_tune_share: float = 1.0) -> Optional[np.ndarray]:
    """Sorted 0-based line indices (int64, length s(r) of the module docstring) that round
    `round_number` trains on, or None when it trains on all `n_lines`."""
    size = round_size(n_lines, round_pairs, round_number, fine_tune_share)
    if size >= n_lines:
        return None
    permutation = np.random.Generator(np.random.PCG64(seed)).permutation(n_lines)
    start = sum(round_size(n_lines, round_pairs, earlier, fine_tune_share)
                for earlier in range(1, round_number)) % n_lines
    positions = (start + np.arange(size)) % n_lines
    return np.sort(permutation[positions])


class SampledBitext:
    """The lines `lines` (sorted 0-based indices) of `bitext` (a Bitext or BitextFiles), as a
    bitext: iterating gives their (source words, target words) in order, reading `bitext` once
    per pass (its ``pairs_at``, which splits only these lines into words); ``len()`` is the
    number of lines kept. ``source_name`` / ``target_name`` are the underlying files (what the
    run record names); ``description`` says which lines."""

    def __init__(self, bitext, lines: np.ndarray, description: str = ""):
        self.bitext = bitext
        self.lines = np.asarray(lines, dtype=np.int64)
        self.source_name, self.target_name = bitext.source_name, bitext.target_name
        self.description = description

    def __iter__(self) -> Iterator[Tuple[List[str], List[str]]]:
        # pairs_at splits only the sample's lines into words: a pass over the files still
        # reads every line before the last one, but no longer tokenizes them (a 40,000-line
        # sample of the 407k en-fr text: 2.84 s a pass before, 0.66 after;
        # eval/results/scale_enfr.md)
        return self.bitext.pairs_at(self.lines.tolist())

    def __len__(self) -> int:
        return len(self.lines)

    @property
    def source(self) -> PairsSide:
        return PairsSide(self, 0)

    @property
    def target(self) -> PairsSide:
        return PairsSide(self, 1)


def round_bitext(bitext, round_pairs: int, seed: int, round_number: int,
                 fine_tune_share: float = 1.0):
    """The bitext round `round_number` trains on: `bitext` itself, or its sample
    (:func:`sample_lines`) as a :class:`SampledBitext`."""
    lines = sample_lines(len(bitext), round_pairs, seed, round_number, fine_tune_share)
    if lines is None:
        return bitext
    return SampledBitext(bitext, lines, f"round {round_number}'s sample of {len(lines)} of "
                                        f"{len(bitext)} lines (seed {seed})")


def teacher_sample(bitext, round_pairs: int, teacher_pairs: int, seed: int):
    """The lines the classical teacher trains on, and where round 1's lines are among them.

    The teacher takes the first max(teacher_pairs, round_pairs) lines of the permutation whose
    first round_pairs are round 1's sample (0 for either: all lines), so its lines hold round
    1's. Returns (the teacher's bitext: `bitext` itself or a :class:`SampledBitext`, the 0-based
    positions of round 1's lines among the teacher's, sorted, int64; None where round 1 trains
    on all of the teacher's lines)."""
    n_lines = len(bitext)
    cap = 0 if round_pairs <= 0 or teacher_pairs <= 0 else max(teacher_pairs, round_pairs)
    teacher_lines = sample_lines(n_lines, cap, seed, 1)
    round_lines = sample_lines(n_lines, round_pairs, seed, 1)
    if teacher_lines is None:
        return bitext, round_lines
    positions = None
    if round_lines is not None and len(round_lines) < len(teacher_lines):
        positions = np.searchsorted(teacher_lines, round_lines)
    return (SampledBitext(bitext, teacher_lines, f"the teacher's sample of {len(teacher_lines)} "
                                                 f"of {n_lines} lines (seed {seed})"),
            positions)
