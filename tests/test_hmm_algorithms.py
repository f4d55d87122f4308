"""HMM algorithms against brute-force enumeration and an explicit forward–backward."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from aligner.models import hmm_algorithms as hmm


def _random_hmm(batch: int, steps: int, states: int, seed: int, dtype=torch.float64):
    """Normalized random HMM scores: (log_emission, log_initial, log_transition)."""
    generator = torch.Generator().manual_seed(seed)
    emission = torch.randn(batch, steps, states, generator=generator, dtype=dtype) * 2 - 1
    initial = torch.log_softmax(torch.randn(batch, states, generator=generator, dtype=dtype), -1)
    transition = torch.log_softmax(
        torch.randn(batch, steps, states, states, generator=generator, dtype=dtype) * 2, -1)
    return emission, initial, transition


def _brute_force(emission, initial, transition, length, states):
    """All paths of one sentence over the first `length` positions and first `states` states.

    Returns (log Z, posteriors (length, states), best path, best score), in plain Python.
    """
    scores = {}
    for path in itertools.product(range(states), repeat=length):
        score = float(initial[path[0]] + emission[0, path[0]])
        for i in range(1, length):
            score += float(transition[i, path[i - 1], path[i]] + emission[i, path[i]])
        scores[path] = score
    log_z = math.log(sum(math.exp(s) for s in scores.values()))
    gamma = torch.zeros(length, states, dtype=torch.float64)
    for path, score in scores.items():
        for i, j in enumerate(path):
            gamma[i, j] += math.exp(score - log_z)
    best = max(scores, key=scores.get)
    return log_z, gamma, list(best), scores[best]


def _explicit_forward_backward(emission, initial, transition):
    """Textbook forward–backward in probability space (float64), one sentence: γ (I, J)."""
    e, pi, a = emission.exp(), initial.exp(), transition.exp()
    steps, states = e.shape
    alpha = torch.zeros(steps, states, dtype=torch.float64)
    beta = torch.ones(steps, states, dtype=torch.float64)
    alpha[0] = pi * e[0]
    for i in range(1, steps):
        alpha[i] = (alpha[i - 1] @ a[i]) * e[i]
    for i in range(steps - 2, -1, -1):
        beta[i] = a[i + 1] @ (e[i + 1] * beta[i + 1])
    z = alpha[-1].sum()
    return alpha * beta / z


@pytest.mark.parametrize("steps,states", [(1, 3), (2, 2), (3, 3), (4, 3), (3, 4)])
def test_forward_log_z_equals_brute_force(steps, states):
    emission, initial, transition = _random_hmm(2, steps, states, seed=steps * 10 + states)
    log_z = hmm.forward_log_z(emission, initial, transition)
    log_z_parallel = hmm.forward_log_z_parallel(emission, initial, transition)
    for b in range(2):
        expected, _, _, _ = _brute_force(emission[b], initial[b], transition[b], steps, states)
        assert log_z[b].item() == pytest.approx(expected, abs=1e-10)
        assert log_z_parallel[b].item() == pytest.approx(expected, abs=1e-10)


def test_forward_log_z_of_normalized_hmm_without_evidence_is_zero():
    """With emissions log 1 = 0 the path probabilities of a normalized HMM sum to 1."""
    _, initial, transition = _random_hmm(3, 5, 4, seed=3)
    zero = torch.zeros(3, 5, 4, dtype=torch.float64)
    assert torch.allclose(hmm.forward_log_z(zero, initial, transition),
                          torch.zeros(3, dtype=torch.float64), atol=1e-12)


def test_variable_lengths_and_padded_states_match_unpadded_brute_force():
    """Sentence b uses only its first lengths[b] positions and its unmasked states."""
    steps, states = 4, 4
    emission, initial, transition = _random_hmm(3, steps, states, seed=7)
    lengths = torch.tensor([4, 2, 1])
    real_states = [4, 3, 2]
    mask = torch.arange(states).unsqueeze(0) < torch.tensor(real_states).unsqueeze(1)
    # garbage in padded corners must not matter: put large values there
    emission = emission.masked_fill(~mask[:, None, :], 50.0)
    for function in (hmm.forward_log_z, hmm.forward_log_z_parallel):
        log_z = function(emission, initial, transition, lengths, mask)
        for b in range(3):
            # the brute force sees the sentence cut to its own size, re-normalization irrelevant
            expected, _, _, _ = _brute_force(emission[b], initial[b], transition[b],
                                             int(lengths[b]), real_states[b])
            assert log_z[b].item() == pytest.approx(expected, abs=1e-10), function.__name__


def test_autograd_posteriors_equal_explicit_forward_backward_and_brute_force():
    steps, states = 4, 3
    emission, initial, transition = _random_hmm(2, steps, states, seed=11)
    emission.requires_grad_(True)
    gamma = hmm.posteriors(hmm.forward_log_z(emission, initial, transition), emission)
    for b in range(2):
        explicit = _explicit_forward_backward(emission[b].detach(), initial[b], transition[b])
        _, brute, _, _ = _brute_force(emission[b].detach(), initial[b], transition[b],
                                      steps, states)
        assert torch.allclose(gamma[b], explicit, atol=1e-10)
        assert torch.allclose(gamma[b], brute, atol=1e-10)
    assert torch.allclose(gamma.sum(-1), torch.ones(2, steps, dtype=torch.float64), atol=1e-10)


def test_parallel_posteriors_equal_sequential_with_padding():
    steps, states = 7, 5
    emission, initial, transition = _random_hmm(3, steps, states, seed=5)
    lengths = torch.tensor([7, 4, 1])
    mask = torch.arange(states).unsqueeze(0) < torch.tensor([5, 3, 4]).unsqueeze(1)
    emission.requires_grad_(True)
    sequential = hmm.posteriors(
        hmm.forward_log_z(emission, initial, transition, lengths, mask), emission)
    parallel = hmm.posteriors(
        hmm.forward_log_z_parallel(emission, initial, transition, lengths, mask), emission)
    assert torch.allclose(sequential, parallel, atol=1e-9)
    # real rows sum to one, padded rows and padded states are exactly zero
    sums = sequential.sum(-1)
    for b, length in enumerate(lengths.tolist()):
        assert torch.allclose(sums[b, :length], torch.ones(length, dtype=torch.float64))
        assert torch.all(sums[b, length:] == 0)
    assert torch.all(sequential.masked_select(~mask[:, None, :].expand_as(sequential)) == 0)


def test_parallel_forward_agrees_in_float32_at_realistic_size():
    """B=4, I=J=40, peaked transitions (spread of tens of nats) as a trained model has them."""
    generator = torch.Generator().manual_seed(0)
    emission = torch.log_softmax(torch.randn(4, 40, 40, generator=generator) * 4, -1)
    initial = torch.log_softmax(torch.randn(4, 40, generator=generator) * 4, -1)
    transition = torch.log_softmax(torch.randn(4, 40, 40, 40, generator=generator) * 4, -1)
    lengths = torch.tensor([40, 33, 12, 2])
    sequential = hmm.forward_log_z(emission, initial, transition, lengths)
    parallel = hmm.forward_log_z_parallel(emission, initial, transition, lengths)
    assert torch.allclose(sequential, parallel, rtol=1e-5, atol=1e-3)


def test_log_matmul_equals_broadcast_logsumexp():
    generator = torch.Generator().manual_seed(1)
    left = torch.randn(3, 4, 5, generator=generator, dtype=torch.float64) * 10
    right = torch.randn(3, 5, 6, generator=generator, dtype=torch.float64) * 10
    expected = torch.logsumexp(left.unsqueeze(-1) + right.unsqueeze(-3), dim=-2)
    assert torch.allclose(hmm.log_matmul(left, right), expected, atol=1e-10)


def test_minus_infinity_inputs_give_finite_gradients():
    """Masked log_softmax outputs contain -inf; neither value nor gradient may become NaN."""
    steps, states = 3, 4
    emission, initial, transition = _random_hmm(2, steps, states, seed=2)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    transition = torch.log_softmax(
        transition.masked_fill(~mask[:, None, None, :], float("-inf")), -1)
    emission = emission.masked_fill(~mask[:, None, :], float("-inf")).requires_grad_(True)
    for function in (hmm.forward_log_z, hmm.forward_log_z_parallel):
        log_z = function(emission, initial, transition, None, mask)
        gamma = hmm.posteriors(log_z, emission)
        assert torch.isfinite(log_z).all() and torch.isfinite(gamma).all()
        assert torch.allclose(gamma.sum(-1), torch.ones(2, steps, dtype=torch.float64))


@pytest.mark.parametrize("steps,states", [(1, 3), (3, 3), (4, 3), (2, 4)])
def test_viterbi_equals_brute_force_best_path(steps, states):
    emission, initial, transition = _random_hmm(3, steps, states, seed=steps + 100 * states)
    path, score = hmm.viterbi(emission, initial, transition)
    for b in range(3):
        _, _, best, best_score = _brute_force(emission[b], initial[b], transition[b],
                                              steps, states)
        assert path[b].tolist() == best
        assert score[b].item() == pytest.approx(best_score, abs=1e-10)


def test_viterbi_with_padding_marks_padded_positions():
    steps, states = 4, 4
    emission, initial, transition = _random_hmm(2, steps, states, seed=9)
    lengths = torch.tensor([2, 4])
    mask = torch.arange(states).unsqueeze(0) < torch.tensor([2, 4]).unsqueeze(1)
    path, score = hmm.viterbi(emission, initial, transition, lengths, mask)
    _, _, best, best_score = _brute_force(emission[0], initial[0], transition[0], 2, 2)
    assert path[0].tolist() == best + [-1, -1]
    assert score[0].item() == pytest.approx(best_score, abs=1e-10)
    _, _, best, _ = _brute_force(emission[1], initial[1], transition[1], 4, 4)
    assert path[1].tolist() == best


def test_zero_order_posterior_sums_to_one_and_matches_bayes_rule():
    generator = torch.Generator().manual_seed(4)
    alignment = torch.log_softmax(
        torch.randn(2, 3, 5, generator=generator, dtype=torch.float64), -1)
    emission = torch.randn(2, 3, 5, generator=generator, dtype=torch.float64) - 2
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    gamma = hmm.zero_order_posterior(alignment, emission, mask)
    assert torch.allclose(gamma.sum(-1), torch.ones(2, 3, dtype=torch.float64))
    assert torch.all(gamma[1, :, 3:] == 0)
    joint = (alignment + emission).exp() * mask[:, None, :]
    assert torch.allclose(gamma, joint / joint.sum(-1, keepdim=True), atol=1e-12)
    log_likelihood = hmm.zero_order_log_likelihood(alignment, emission, mask)
    assert torch.allclose(log_likelihood, joint.sum(-1).log(), atol=1e-12)


def test_zero_order_is_first_order_with_position_independent_transitions():
    """A first-order HMM whose transition rows ignore j' is the zero-order mixture."""
    steps, states = 4, 3
    emission, _, transition = _random_hmm(2, steps, states, seed=12)
    alignment = transition[:, :, 0, :]                                  # α(j | i), (B, I, J)
    first_order = alignment.unsqueeze(2).expand(-1, -1, states, -1)
    log_z = hmm.forward_log_z(emission, alignment[:, 0], first_order)
    mixture = hmm.zero_order_log_likelihood(alignment, emission).sum(-1)
    assert torch.allclose(log_z, mixture, atol=1e-10)


def test_log_matmul_stays_in_float32_under_autocast():
    generator = torch.Generator().manual_seed(3)
    left = torch.randn(2, 6, 6, generator=generator) * 5
    right = torch.randn(2, 6, 6, generator=generator) * 5
    expected = torch.logsumexp(left.unsqueeze(-1) + right.unsqueeze(-3), dim=-2)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        result = hmm.log_matmul(left, right)
    assert result.dtype == torch.float32
    assert torch.allclose(result, expected, atol=1e-4)


# -- chunked transitions and the explicit forward–backward ----------------------------------

def _padded_case(seed: int):
    """B=3, I=7, J=5 with lengths 7/4/1 and 5/3/4 real states, garbage in padded corners."""
    emission, initial, transition = _random_hmm(3, 7, 5, seed=seed)
    lengths = torch.tensor([7, 4, 1])
    mask = torch.arange(5).unsqueeze(0) < torch.tensor([5, 3, 4]).unsqueeze(1)
    return emission.masked_fill(~mask[:, None, :], 30.0), initial, transition, lengths, mask


class _CountingTransitions:
    """A TransitionFn over a fixed tensor that records the widest slice it was asked for."""

    def __init__(self, transition):
        self.transition, self.widest, self.calls = transition, 0, 0

    def __call__(self, start, stop):
        self.widest, self.calls = max(self.widest, stop - start), self.calls + 1
        return self.transition[:, start:stop]


@pytest.mark.parametrize("chunk", [None, 1, 2, 3, 100])
def test_explicit_forward_backward_equals_autograd_posteriors_and_brute_force(chunk):
    emission, initial, transition, lengths, mask = _padded_case(seed=21)
    leaf = emission.clone().requires_grad_(True)
    expected = hmm.posteriors(hmm.forward_log_z(leaf, initial, transition, lengths, mask), leaf)
    fn = _CountingTransitions(transition)
    gamma = hmm.forward_backward(emission, initial, fn, lengths, mask, chunk=chunk)
    assert torch.allclose(gamma, expected, atol=1e-10)
    for b, length in enumerate(lengths.tolist()):
        states = int(mask[b].sum())
        _, brute, _, _ = _brute_force(emission[b], initial[b], transition[b], length, states)
        assert torch.allclose(gamma[b, :length, :states], brute, atol=1e-10)
        assert torch.all(gamma[b, length:] == 0) and torch.all(gamma[b, :, states:] == 0)
    assert fn.widest == (chunk if chunk and chunk < 6 else 6)
    # every piece twice (forward and backward pass) but the last, kept from the forward pass
    pieces = -(-6 // min(chunk or 6, 6))
    assert fn.calls == 2 * pieces - 1
    # the same posteriors from transition probabilities given directly (the models' softmax)
    probs = _CountingTransitions(transition.exp())
    direct = hmm.forward_backward(emission, initial, fn, lengths, mask, chunk=chunk,
                                  transition_probs=probs)
    assert torch.allclose(direct, expected, atol=1e-10) and probs.widest == fn.widest


def test_explicit_forward_backward_in_float32_survives_peaked_scores():
    """Emissions of -200 nats and near-deterministic transitions: no NaN, rows sum to 1,
    and the same posteriors as autograd in float64."""
    generator = torch.Generator().manual_seed(5)
    emission = torch.randn(2, 30, 20, generator=generator, dtype=torch.float64) * 40 - 200
    initial = torch.log_softmax(torch.randn(2, 20, generator=generator, dtype=torch.float64)
                                * 10, -1)
    transition = torch.log_softmax(
        torch.randn(2, 30, 20, 20, generator=generator, dtype=torch.float64) * 10, -1)
    leaf = emission.clone().requires_grad_(True)
    expected = hmm.posteriors(hmm.forward_log_z(leaf, initial, transition), leaf)
    gamma = hmm.forward_backward(emission.float(), initial.float(), transition.float(), chunk=7)
    assert torch.isfinite(gamma).all()
    assert torch.allclose(gamma.sum(-1), torch.ones(2, 30), atol=1e-5)
    assert torch.allclose(gamma.double(), expected, atol=1e-4)


@pytest.mark.parametrize("chunk", [1, 2, 4])
def test_chunked_forward_log_z_equals_whole_in_value_and_gradient(chunk):
    emission, initial, transition, lengths, mask = _padded_case(seed=22)
    inputs = [t.clone().requires_grad_(True) for t in (emission, initial, transition)]
    whole = hmm.forward_log_z(*inputs, lengths, mask)
    whole_grads = torch.autograd.grad(whole.sum(), inputs)
    inputs2 = [t.clone().requires_grad_(True) for t in (emission, initial, transition)]
    fn = _CountingTransitions(inputs2[2])
    chunked = hmm.forward_log_z(inputs2[0], inputs2[1], fn, lengths, mask, chunk=chunk)
    chunked_grads = torch.autograd.grad(chunked.sum(), inputs2)
    assert torch.allclose(whole, chunked, atol=1e-12)
    for a, b in zip(whole_grads, chunked_grads):
        assert torch.allclose(a, b, atol=1e-12)
    assert fn.widest == chunk
    assert fn.calls > 6 // chunk          # backward recomputed the pieces (checkpointing)


@pytest.mark.parametrize("chunk", [1, 3])
def test_chunked_viterbi_equals_whole(chunk):
    emission, initial, transition, lengths, mask = _padded_case(seed=23)
    path, score = hmm.viterbi(emission, initial, transition, lengths, mask)
    fn = _CountingTransitions(transition)
    path_c, score_c = hmm.viterbi(emission, initial, fn, lengths, mask, chunk=chunk)
    assert torch.equal(path, path_c) and torch.allclose(score, score_c)
    assert fn.widest == chunk
