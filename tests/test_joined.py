"""Training units of joined lines (aligner/training/joined.py, --join-lines)."""
from __future__ import annotations

import numpy as np
import pytest

from aligner.data import EncodedCorpus
from aligner.training.joined import JoinedCorpus, JoinedGuides, training_units, unit_sizes
from cli_runner import run
from synthetic import monotone_corpus, write_corpus


class _Corpus:
    """The part of an EncodedCorpus the units read: ids by pair, lengths, stats."""

    def __init__(self, sources, targets, max_len=0):
        self._s, self._t = [np.asarray(s) for s in sources], [np.asarray(t) for t in targets]
        self.src_lengths = np.array([len(s) for s in sources], dtype=np.int64)
        self.tgt_lengths = np.array([len(t) for t in targets], dtype=np.int64)
        self.directory = None
        self.stats = type("Stats", (), {"max_len": max_len})()

    def __len__(self):
        return len(self._s)

    def source(self, k):
        return self._s[k]

    def target(self, k):
        return self._t[k]


class _Guides:
    def __init__(self, links):
        self.links = [np.asarray(x, dtype=np.int64).reshape(-1, 2) for x in links]

    def pair(self, k):
        return self.links[k]


@pytest.mark.parametrize("most", [1, 2, 5])
def test_units_cover_every_pair_once_in_order_within_the_limits(most):
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 30, size=500), rng.integers(1, 30, size=500)
    sizes = unit_sizes(src, tgt, most, max_len=60, seed=3)
    assert sizes.sum() == 500 and sizes.min() >= 1 and sizes.max() <= most
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    for start, size in zip(starts, sizes):
        if size > 1:   # a joined unit stays within max_len on both sides
            assert src[start:start + size].sum() <= 60 and tgt[start:start + size].sum() <= 60
    assert np.array_equal(sizes, unit_sizes(src, tgt, most, 60, seed=3))   # a function of seed
    if most == 1:
        assert (sizes == 1).all()
    else:   # the draws are uniform over 1..most: some units of every size below the cap
        assert set(sizes.tolist()) == set(range(1, most + 1))
        assert not np.array_equal(sizes, unit_sizes(src, tgt, most, 60, seed=4))


def test_a_pair_longer_than_the_limit_stays_a_unit_of_its_own():
    sizes = unit_sizes([5, 50, 5, 5], [5, 50, 5, 5], 4, max_len=40, seed=1)
    # pair 1 (50 subwords) is never joined to another pair
    unit_of = np.repeat(np.arange(len(sizes)), sizes)
    assert (unit_of == unit_of[1]).sum() == 1


def test_a_unit_joins_its_pairs_ids_and_shifts_their_guide_links():
    corpus = _Corpus([[1, 2], [3], [4, 5, 6]], [[7], [8, 9], [10]])
    units = JoinedCorpus(corpus, np.array([2, 1]))
    assert len(units) == 2
    assert units.source(0).tolist() == [1, 2, 3] and units.target(0).tolist() == [7, 8, 9]
    assert units.source(1).tolist() == [4, 5, 6] and units.target(1).tolist() == [10]
    assert units.src_lengths.tolist() == [3, 3] and units.tgt_lengths.tolist() == [3, 1]
    guides = JoinedGuides(_Guides([[[0, 0], [1, 0]], [[0, 1]], [[2, 0]]]), units)
    # pair 1's link (0, 1) moves by pair 0's 2 source and 1 target subwords
    assert guides.pair(0).tolist() == [[0, 0], [1, 0], [2, 2]]
    assert guides.pair(1).tolist() == [[2, 0]]


def test_one_line_per_unit_is_the_corpus_itself():
    corpus = _Corpus([[1]], [[2]])
    assert training_units(corpus, 1, seed=1) is corpus


def test_align_train_with_joined_lines_trains_on_fewer_longer_units(tmp_path):
    sources, targets, _ = monotone_corpus(120, seed=5)
    src, tgt, _ = write_corpus(tmp_path, "c", sources, targets)
    guide = tmp_path / "guide.align"
    guide.write_text("".join(" ".join(f"{i}-{i}" for i in range(len(s.split()))) + "\n"
                             for s in open(src, encoding="utf-8")))
    result = run("train", "-s", src, "-t", tgt, "-o", tmp_path / "m", "--model", "hmm1",
                 "--rounds", "1", "--guide", guide, "--join-lines", "4", "--max-updates", "2",
                 "-M", "d_model=16", "-M", "enc_layers=1", "-M", "dec_layers=2",
                 "--bpe-merges", "0", "--threads", "1", "--directions", "fwd")
    assert result.exit_code == 0, result.output
    corpus = EncodedCorpus.open(str(tmp_path / "m" / "corpus"))
    units = training_units(corpus, 4, seed=1)
    assert len(units) < len(corpus) and units.src_lengths.sum() == corpus.src_lengths.sum()
    assert "120 training pairs in" in result.output and "units of up to 4 lines" in result.output
