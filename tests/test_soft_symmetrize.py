"""Soft-average symmetrization on hand-computed grids."""
import numpy as np
import pytest

from aligner.links.soft_symmetrize import soft_average, soft_average_corpus
from aligner.utils import AlignerError


def test_hand_computed_grid():
    # 3 source words (rows) x 3 target words (columns), source-target orientation.
    forward = np.array([[0.9, 0.1, 0.0],     # columns: distributions over source words
                        [0.1, 0.5, 0.3],
                        [0.0, 0.4, 0.6]])
    reverse = np.array([[0.8, 0.2, 0.0],     # rows: distributions over target words
                        [0.0, 0.45, 0.55],
                        [0.0, 0.3, 0.7]])
    # means: (0,0) .85, (1,1) .475, (1,2) .425, (2,1) .35, (2,2) .65; all others below .15
    assert soft_average(forward, reverse) == {(0, 0), (2, 2)}
    assert soft_average(forward, reverse, threshold=0.4) == {(0, 0), (1, 1), (1, 2), (2, 2)}
    assert soft_average(forward, reverse, threshold=0.9) == set()


def test_threshold_is_strict_and_one_word_may_get_two_links():
    # target word 0 is split between source words 0 and 1 by the forward model; each source
    # word puts all its reverse probability on target word 0.
    forward = np.array([[0.5], [0.5]])
    reverse = np.array([[1.0], [1.0]])
    assert soft_average(forward, reverse) == {(0, 0), (1, 0)}
    assert soft_average(forward, reverse, threshold=0.75) == set()   # mean is exactly 0.75


def test_shapes_must_match():
    with pytest.raises(AlignerError, match="differ in shape"):
        soft_average(np.zeros((2, 3)), np.zeros((3, 2)))
    with pytest.raises(AlignerError, match="differ in length"):
        soft_average_corpus([np.zeros((1, 1))], [])


def test_empty_sentence_and_corpus_order():
    assert soft_average(np.zeros((0, 0)), np.zeros((0, 0))) == set()
    forward = [np.eye(2), np.array([[0.0, 1.0], [1.0, 0.0]])]
    reverse = [np.eye(2), np.array([[0.0, 1.0], [1.0, 0.0]])]
    assert soft_average_corpus(forward, reverse) == [{(0, 0), (1, 1)}, {(0, 1), (1, 0)}]
