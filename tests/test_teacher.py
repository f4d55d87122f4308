"""The classical EM teacher (aligner/training/teacher.py): its forward–backward against an
enumeration of every state path, one IBM-1 iteration against hand-computed counts, and the whole
aligner on a synthetic corpus whose links are known."""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

from aligner.links.combine import combine
from aligner.training.teacher import TeacherConfig, _Direction, soft_alignments


def _paths(direction: _Direction, batch, row: int):
    """Every state path of one line of the HMM as aligner/training/teacher.py's docstring defines it
    (empty state J + j' continues from position j'): yields (path, its joint probability with
    the observed words, its moves (j', j) into real states)."""
    p0 = direction.config.empty_prob
    size = batch.given_len
    length = int(batch.lengths[row])
    emission = direction.lexicon[batch.pairs[row, :length]]          # (I, J+1)
    trans = direction._transitions(size)
    for path in itertools.product(range(2 * size), repeat=length):
        p, position, moves = 1.0, None, []
        for i, state in enumerate(path):
            real = state < size
            if i == 0:
                step = (1 - p0) / size if real else p0 / size
            elif real:
                step = float(trans[position, state])
                moves.append((position, state))
            else:
                step = p0 if state - size == position else 0.0
            position = state if real else state - size
            p *= step * float(emission[i, state if real else size])
        yield path, p, moves


def _enumerated_posteriors(direction: _Direction, batch, row: int):
    """(I, 2J) state posteriors and log Z of one line by summing over all its paths."""
    length = int(batch.lengths[row])
    total = 0.0
    gamma = torch.zeros(length, 2 * batch.given_len, dtype=torch.float64)
    for path, p, _ in _paths(direction, batch, row):
        total += p
        for i, state in enumerate(path):
            gamma[i, state] += p
    return gamma / total, np.log(total)


def test_forward_backward_equals_the_enumeration_of_every_path():
    observed = [["a", "b", "c"], ["b", "a"], ["c", "c", "a"]]
    given = [["x", "y"], ["y", "x", "z"], ["z", "y"]]
    direction = _Direction(observed, given, TeacherConfig(empty_prob=0.3, max_jump=2))
    generator = torch.Generator().manual_seed(0)
    direction.lexicon = torch.rand(direction.size + 1, generator=generator,
                                   dtype=torch.float64) + 0.05
    direction.lexicon[-1] = 0.0
    direction.jumps = torch.rand(5, generator=generator, dtype=torch.float64) + 0.1
    checked = 0
    for batch in direction.batches:
        posterior, log_likelihood, _ = direction.hmm_pass(batch, want_counts=False)
        expected_ll = 0.0
        for row in range(len(batch.lines)):
            gamma, log_z = _enumerated_posteriors(direction, batch, row)
            length = int(batch.lengths[row])
            torch.testing.assert_close(posterior[row, :length].double(), gamma,
                                       rtol=0, atol=1e-6)
            assert float(posterior[row, length:].abs().sum()) == 0.0   # padding
            expected_ll += log_z
            checked += 1
        assert log_likelihood == pytest.approx(expected_ll, abs=1e-5)
    assert checked == 3


def test_expected_jumps_equal_the_enumeration():
    """The (J, J) expected transitions into real states equal the sum over paths."""
    observed, given = [["a", "b", "a"]], [["x", "y", "z"]]
    config = TeacherConfig(empty_prob=0.25, max_jump=1)
    direction = _Direction(observed, given, config)
    generator = torch.Generator().manual_seed(1)
    direction.lexicon = torch.rand(direction.size + 1, generator=generator,
                                   dtype=torch.float64) + 0.05
    direction.lexicon[-1] = 0.0
    direction.jumps = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    (batch,) = direction.batches
    _, _, jumps = direction.hmm_pass(batch, want_counts=True)
    expected = torch.zeros(3, 3, dtype=torch.float64)
    total = 0.0
    for _, p, moves in _paths(direction, batch, 0):
        total += p
        for move in moves:
            expected[move] += p
    torch.testing.assert_close(jumps.double(), expected / total, rtol=0, atol=1e-6)


def test_one_ibm1_iteration_gives_the_hand_computed_lexicon():
    """Two lines, uniform start: line 1 'a' given 'x' (with the empty word e), line 2 'a b'
    given 'x y'. From t = 1 everywhere each observed word's posterior is uniform over its
    line's given words and the empty word: line 1 gives c(x,a) = 1/2, c(e,a) = 1/2; line 2
    gives 1/3 to each of x, y, e for each of a and b. So c(x,a) = 5/6, c(x,b) = 1/3,
    t(a|x) = (5/6) / (7/6) = 5/7; c(e,a) = 5/6, c(e,b) = 1/3, t(a|e) = 5/7;
    c(y,a) = c(y,b) = 1/3, t(a|y) = 1/2."""
    direction = _Direction([["a"], ["a", "b"]], [["x"], ["x", "y"]], TeacherConfig())
    direction.ibm1_iteration()
    table = {}
    for batch in direction.batches:
        for row, line in enumerate(batch.lines):
            observed = [["a"], ["a", "b"]][line]
            given = [["x"], ["x", "y"]][line] + ["<e>"]
            for i, o in enumerate(observed):
                for j, g in enumerate(given):
                    table[(g, o)] = float(direction.lexicon[batch.pairs[row, i, j]])
    assert table[("x", "a")] == pytest.approx(5 / 7)
    assert table[("x", "b")] == pytest.approx(2 / 7)
    assert table[("<e>", "a")] == pytest.approx(5 / 7)
    assert table[("y", "a")] == pytest.approx(1 / 2)
    assert table[("y", "b")] == pytest.approx(1 / 2)


def _synthetic_corpus(lines: int, seed: int):
    """A source of random words 'sK' and a target of their translations 'tK', in the same
    order but with one adjacent pair swapped in about half the lines; returns the two sides
    and each line's true links."""
    rng = random.Random(seed)
    source, target, gold = [], [], []
    for _ in range(lines):
        words = [rng.randrange(40) for _ in range(rng.randint(3, 9))]
        order = list(range(len(words)))
        if rng.random() < 0.5:
            k = rng.randrange(len(words) - 1)
            order[k], order[k + 1] = order[k + 1], order[k]
        source.append([f"s{w}" for w in words])
        target.append([f"t{words[k]}" for k in order])
        gold.append({(k, j) for j, k in enumerate(order)})
    return source, target, gold


def test_the_teacher_finds_the_links_of_a_synthetic_corpus():
    source, target, gold = _synthetic_corpus(400, seed=3)
    soft = soft_alignments(source, target, TeacherConfig(ibm1_iterations=5, hmm_iterations=3))
    for name in ("fwd", "rev"):
        assert [m.shape for m in soft[name]] == [(len(s), len(t))
                                                 for s, t in zip(source, target)]
    links = combine("soft-average", 0.5, soft=soft)
    found = sum(len(a & g) for a, g in zip(links, gold))
    predicted = sum(len(a) for a in links)
    true = sum(len(g) for g in gold)
    # a word repeated within a line can be confused with its twin; everything else is found.
    # Measured over corpus seeds 0-5: precision 0.991-0.998, recall 0.979-0.995 (seed 3:
    # 0.997 / 0.993), the same with 1 and 2 threads and with ATEN_CPU_CAPABILITY=default
    assert found / predicted > 0.97 and found / true > 0.97


def test_empty_lines_get_empty_matrices():
    source = [["a", "b"], [], ["a"]]
    target = [["x", "y"], ["z"], ["x"]]
    soft = soft_alignments(source, target, TeacherConfig(ibm1_iterations=2, hmm_iterations=1))
    assert [m.shape for m in soft["fwd"]] == [(2, 2), (0, 1), (1, 1)]
    assert [m.shape for m in soft["rev"]] == [(2, 2), (0, 1), (1, 1)]
    assert not soft["fwd"][1].size


def test_the_m_step_takes_the_empty_word_from_the_mass_left_over():
    """One line, observed 'a b' given 'x', link posteriors 0.6 and 0.2: counts (x,a) 0.6,
    (x,b) 0.2, (empty,a) 0.4, (empty,b) 0.8, so t(a|x) = 0.75, t(b|x) = 0.25, t(a|empty) =
    1/3, t(b|empty) = 2/3 (what agreement training hands over: products that sum below 1)."""
    direction = _Direction([["a", "b"]], [["x"]], TeacherConfig())
    (batch,) = direction.batches
    direction.maximize([torch.tensor([[[0.6], [0.2]]])], torch.ones_like(direction.jumps))
    table = direction.lexicon[batch.pairs[0]]          # (I, J+1): rows a, b; columns x, empty
    torch.testing.assert_close(table, torch.tensor([[0.75, 1 / 3], [0.25, 2 / 3]],
                                                   dtype=torch.float64))


def test_agreement_counts_are_the_product_of_both_directions_posteriors():
    from aligner.training.teacher import _agreed

    source, target = [["x", "y"], ["y"]], [["a", "b", "c"], ["b", "a"]]
    config = TeacherConfig(ibm1_iterations=1, hmm_iterations=0)
    directions = {"fwd": _Direction(target, source, config),
                  "rev": _Direction(source, target, config)}
    for direction in directions.values():
        direction.ibm1_iteration()
    posteriors = {name: d.expectations()[0] for name, d in directions.items()}
    fwd = directions["fwd"].by_line([p.clone() for p in posteriors["fwd"]], 2)
    rev = directions["rev"].by_line([p.clone() for p in posteriors["rev"]], 2)
    both = _agreed(directions, posteriors, 2)
    assert not posteriors                                  # taken out, to be freed
    for n in range(2):
        assert fwd[n].shape == (len(target[n]), len(source[n]))
        np.testing.assert_allclose(both[n], fwd[n] * rev[n].T, rtol=1e-6)
    # and back into each direction's batches, line by line
    for row_batches, name, lines in ((directions["fwd"].to_batches(both), "fwd", both),
                                     (directions["rev"].to_batches([b.T for b in both]),
                                      "rev", [b.T for b in both])):
        assert directions[name].by_line(row_batches, 2)[0].tolist() == lines[0].tolist()


def test_lines_longer_than_max_words_get_no_links():
    source = [["a", "b", "c"], ["a"]]
    target = [["x", "y", "z"], ["x"]]
    soft = soft_alignments(source, target, TeacherConfig(ibm1_iterations=1, hmm_iterations=1,
                                                         max_words=2))
    assert soft["fwd"][0].shape == (0, 0)   # no elements, whatever the line's length
    assert soft["rev"][1].shape == (1, 1) and soft["rev"][1].any()
