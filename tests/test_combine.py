"""aligner.links.combine: the one function that combines the two directions, on hand-drawn grids.

Grids: row i = source word, column j = target word (0-based, source–target orientation).
"""
import numpy as np
import pytest

from aligner import constants as C
from aligner.links.combine import KNOWN_HEURISTICS, check_heuristic, combine, needs_soft
from aligner.links.soft_symmetrize import DEFAULT_THRESHOLD, soft_average
from aligner.links.symmetrize import symmetrize
from aligner.utils import AlignerError

# 3 source x 3 target words. forward: each column a distribution over source words;
# reverse: each row a distribution over target words.
FORWARD_SOFT = np.array([[0.9, 0.1, 0.0],
                         [0.1, 0.5, 0.3],
                         [0.0, 0.4, 0.6]])
REVERSE_SOFT = np.array([[0.8, 0.2, 0.0],
                         [0.0, 0.45, 0.55],
                         [0.0, 0.3, 0.7]])
# means: (0,0) .85, (1,1) .475, (1,2) .425, (2,1) .35, (2,2) .65; all others below .15

# B..      forward {0-0, 1-1, 2-2}, reverse {0-0, 1-2, 2-2}
# .FR      grow-diag: intersection {0-0, 2-2}; candidates 1-1 (source 1 unaligned, touches
# ..B      0-0: added), then 1-2 (source 1 and target 2 now aligned: rejected)
FORWARD_HARD = {(0, 0), (1, 1), (2, 2)}
REVERSE_HARD = {(0, 0), (1, 2), (2, 2)}


def test_soft_average_on_a_grid_at_two_thresholds():
    soft = {"fwd": [FORWARD_SOFT, np.zeros((0, 0))], "rev": [REVERSE_SOFT, np.zeros((0, 0))]}
    assert combine("soft-average", 0.5, soft=soft) == [{(0, 0), (2, 2)}, set()]
    assert combine("soft-average", 0.4, soft=soft) == [{(0, 0), (1, 1), (1, 2), (2, 2)}, set()]
    for threshold in (0.0, 0.35, 0.4, 0.5, 0.9):
        assert combine("soft-average", threshold, soft=soft)[0] == soft_average(
            FORWARD_SOFT, REVERSE_SOFT, threshold)
    assert combine("soft-average", soft=soft)[0] == soft_average(
        FORWARD_SOFT, REVERSE_SOFT, DEFAULT_THRESHOLD)


def test_moses_heuristics_on_a_grid():
    hard = {"fwd": [FORWARD_HARD, set()], "rev": [REVERSE_HARD, set()]}
    assert combine("grow-diag", hard=hard) == [{(0, 0), (1, 1), (2, 2)}, set()]
    assert combine("intersect", hard=hard)[0] == {(0, 0), (2, 2)}
    assert combine("union", hard=hard)[0] == {(0, 0), (1, 1), (1, 2), (2, 2)}
    for heuristic in C.HEURISTICS:
        assert combine(heuristic, hard=hard)[0] == symmetrize(FORWARD_HARD, REVERSE_HARD,
                                                              heuristic)


def test_only_the_needed_input_is_read():
    hard = {"fwd": [FORWARD_HARD], "rev": [REVERSE_HARD], "grow-diag": "ignored"}
    soft = {"fwd": [FORWARD_SOFT], "rev": [REVERSE_SOFT]}
    # a Moses heuristic ignores the soft matrices and the threshold, soft-average the links
    assert combine("grow-diag", 0.9, hard=hard, soft=soft) == combine("grow-diag", hard=hard)
    assert combine("soft-average", 0.4, hard=hard, soft=soft) == combine(
        "soft-average", 0.4, soft=soft)


def test_needs_soft():
    assert KNOWN_HEURISTICS == C.HEURISTICS + C.SOFT_HEURISTICS
    assert [needs_soft(h) for h in KNOWN_HEURISTICS] == [False] * 5 + [True]
    check_heuristic("grow-diag-final-and")


@pytest.mark.parametrize("call, message", [
    (lambda: needs_soft("grow"), r"^unknown heuristic 'grow' \(choose from intersect, union, "
                                 r"grow-diag, grow-diag-final, grow-diag-final-and, "
                                 r"soft-average\)$"),
    (lambda: combine("diag", hard={"fwd": [], "rev": []}), r"^unknown heuristic 'diag'"),
    (lambda: combine("soft-average", hard={"fwd": [set()], "rev": [set()]}),
     r"^heuristic 'soft-average' combines the two directions' soft alignments: give soft="),
    (lambda: combine("soft-average", soft={"fwd": [FORWARD_SOFT]}),
     r"^heuristic 'soft-average' combines the two directions' soft alignments"),
    (lambda: combine("grow-diag", soft={"fwd": [FORWARD_SOFT], "rev": [REVERSE_SOFT]}),
     r"^heuristic 'grow-diag' combines the two directions' links: give hard="),
    (lambda: combine("union", hard={"rev": [set()]}),
     r"^heuristic 'union' combines the two directions' links"),
    (lambda: combine("union", hard={"fwd": [set()], "rev": []}), "differ in length: 1 and 0"),
    (lambda: combine("soft-average", soft={"fwd": [], "rev": [np.zeros((1, 1))]}),
     "differ in length: 0 and 1"),
    (lambda: combine("soft-average", soft={"fwd": [np.zeros((1, 2))],
                                           "rev": [np.zeros((2, 1))]}), "differ in shape"),
])
def test_refusals(call, message):
    with pytest.raises(AlignerError, match=message) as error:
        call()
    assert "\n" not in str(error.value)
