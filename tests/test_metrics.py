"""AER, precision, recall, F1: hand-counted cases, brute force, and the published numbers."""
from __future__ import annotations

import random
from fractions import Fraction

import pytest

from aligner.formats import GoldAlignment, read_gold, read_pharaoh
from aligner.links.metrics import (AERStats, corpus_stats, score_aer, score_from_stats,
                             sentence_stats, sum_stats)
from aligner.utils import AlignerError


def test_hand_counted_sentence():
    # S = {0-0, 1-1}, P = S + {1-2}; A = {0-0, 1-2, 2-2}
    # |A| = 3, |S| = 2, |A∩S| = 1 (0-0), |A∩P| = 2 (0-0, 1-2)
    gold = GoldAlignment(sure={(0, 0), (1, 1)}, possible={(1, 2)})
    score = score_aer([{(0, 0), (1, 2), (2, 2)}], [gold])
    assert (score.n_hyp, score.n_sure, score.n_possible) == (3, 2, 3)
    assert (score.hyp_and_sure, score.hyp_and_possible) == (1, 2)
    assert score.precision == pytest.approx(2 / 3)
    assert score.recall == pytest.approx(1 / 2)
    assert score.aer == pytest.approx(1 - 3 / 5)
    assert score.f1 == pytest.approx(4 / 7)


def test_corpus_sums_counts_before_dividing():
    # sentence 1: A = S = {0-0} (perfect); sentence 2: A = {0-1, 1-0, 2-2}, S = {0-0, 1-1}
    golds = [GoldAlignment({(0, 0)}), GoldAlignment({(0, 0), (1, 1)})]
    hyps = [{(0, 0)}, {(0, 1), (1, 0), (2, 2)}]
    score = score_aer(hyps, golds)
    # corpus: |A| = 4, |S| = 3, |A∩S| = |A∩P| = 1 -> AER = 1 - 2/7, P = 1/4, R = 1/3
    assert score.aer == pytest.approx(5 / 7)
    assert score.precision == pytest.approx(1 / 4)
    assert score.recall == pytest.approx(1 / 3)
    # which is not the mean of the per-sentence AERs (0 and 1)
    per_sentence = [score_from_stats(s).aer for s in corpus_stats(hyps, golds)]
    assert per_sentence == [0.0, 1.0]


def test_perfect_and_possible_hypotheses():
    gold = GoldAlignment(sure={(0, 0), (1, 1)}, possible={(0, 1), (2, 2)})
    sure_only = score_aer([gold.sure], [gold])
    assert (sure_only.aer, sure_only.precision, sure_only.recall, sure_only.f1) == (0, 1, 1, 1)
    # possible links are never wrong and never required: A = P still has AER 0
    everything = score_aer([gold.possible], [gold])
    assert (everything.aer, everything.precision, everything.recall) == (0, 1, 1)


def test_empty_denominators():
    gold = GoldAlignment(sure={(0, 0)})
    empty_hyp = score_aer([set()], [gold])
    assert (empty_hyp.aer, empty_hyp.precision, empty_hyp.recall, empty_hyp.f1) == (1, 1, 0, 0)
    nothing = score_aer([set(), set()], [GoldAlignment(), GoldAlignment()])
    assert (nothing.aer, nothing.precision, nothing.recall, nothing.f1) == (0, 1, 1, 1)
    only_possible = score_aer([{(1, 1)}], [GoldAlignment(possible={(0, 0)})])
    assert (only_possible.aer, only_possible.precision, only_possible.recall) == (1, 0, 1)
    assert only_possible.f1 == 0
    assert score_aer([], []).aer == 0.0  # an empty corpus does not divide by zero


def test_lengths_must_match():
    with pytest.raises(AlignerError, match="hypothesis has 1 sentence pairs, gold has 2"):
        score_aer([set()], [GoldAlignment(), GoldAlignment()])


def test_possible_built_without_sure_still_counts_sure():
    gold = GoldAlignment({(0, 0)})
    gold.possible = {(1, 1)}  # a caller broke S ⊆ P after construction
    assert sentence_stats({(0, 0)}, gold).hyp_and_possible == 1


def brute_force(hyps, golds):
    """Och & Ney's definitions by enumerating every cell of the grid, in exact fractions."""
    a = s = a_s = a_p = 0
    for hyp, gold in zip(hyps, golds):
        for i in range(8):
            for j in range(8):
                in_a, in_s = (i, j) in hyp, (i, j) in gold.sure
                in_p = in_s or (i, j) in gold.possible
                a += in_a
                s += in_s
                a_s += in_a and in_s
                a_p += in_a and in_p
    return (Fraction(a_p, a), Fraction(a_s, s), 1 - Fraction(a_s + a_p, a + s))


def test_against_brute_force_on_random_corpora():
    rng = random.Random(11)
    cells = [(i, j) for i in range(8) for j in range(8)]
    for _ in range(100):
        hyps, golds = [], []
        for _ in range(rng.randint(1, 5)):
            sure = set(rng.sample(cells, rng.randint(1, 10)))
            possible = set(rng.sample(cells, rng.randint(0, 10)))
            golds.append(GoldAlignment(sure, possible))
            hyps.append(set(rng.sample(cells, rng.randint(1, 12))))
        precision, recall, aer = brute_force(hyps, golds)
        score = score_aer(hyps, golds)
        assert score.precision == pytest.approx(float(precision), abs=1e-12)
        assert score.recall == pytest.approx(float(recall), abs=1e-12)
        assert score.aer == pytest.approx(float(aer), abs=1e-12)


def test_stats_add_up():
    a, b = AERStats(1, 2, 3, 4, 5), AERStats(10, 20, 30, 40, 50)
    assert a + b == AERStats(11, 22, 33, 44, 55)
    assert sum_stats([a, b, a]) == AERStats(12, 24, 36, 48, 60)
    assert sum_stats([]) == AERStats()


@pytest.mark.parametrize("hypothesis, aer, precision, recall, links", [
    # the published numbers of lilt/alignment-scripts (GIZA++ and fast_align, grow-diag)
    ("giza.deen.grow-diagonal.talp", 21.4, 94.3, 67.2, 6974),
    ("fastalign.deen.grow-diagonal.talp", 27.0, 84.5, 64.1, 7419),
    # fast_align atools' grow-diag of the same GIZA++ runs
    ("atools/giza.deen.grow-diag.talp", 19.3, 89.9, 73.1, 7986),
])
def test_reference_numbers(shared_data, hypothesis, aer, precision, recall, links):
    golds = read_gold(str(shared_data / "deen" / "test.talp"))
    score = score_aer(read_pharaoh(str(shared_data / "reference" / hypothesis)), golds)
    assert round(100 * score.aer, 1) == aer
    assert round(100 * score.precision, 1) == precision
    assert round(100 * score.recall, 1) == recall
    assert score.n_hyp == links
    assert (score.n_sure, score.n_possible) == (9613, 9613 + 921)  # shared data README


def test_reverse_hypothesis_reads_like_flipped_file(shared_data):
    golds = read_gold(str(shared_data / "deen" / "test.talp"))
    reference = shared_data / "reference"
    flipped = score_aer(read_pharaoh(str(reference / "giza.deen.reverse.talp"), reverse=True),
                        golds)
    src_tgt = score_aer(read_pharaoh(str(reference / "atools" /
                                         "giza.deen.reverse.src-tgt.talp")), golds)
    assert flipped == src_tgt
