"""The direct HMM's linear lexicon (lexicon_activation="linear", aligner/models/direct_hmm.py):
the factored normalizer against the whole (B, I, J, V) tensor, its gradients, its range, and
the models built on it (losses, decoding, training)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aligner.models.direct_hmm import (DirectHMMConfig, FirstOrderHMM, ZeroOrderHMM,
                                       linear_lexicon_log_probs)
from aligner.utils import AlignerError
from test_model_contract import teacher_forced_log_likelihood, tiny_batch

VOCAB = 11


def _reference(source_hidden, target_hidden, weight, bias, targets, smoothing):
    """log_softmax of the whole tensor W4·(W5·h_j + W6·s_i) + b, gathered at e_i, smoothed."""
    logits = F.linear(source_hidden[:, None] + target_hidden[:, :, None], weight, bias)
    log_probs = torch.log_softmax(logits, -1)                          # (B, I, J, V)
    gold = log_probs.gather(-1, targets[:, :, None, None].expand(-1, -1, logits.size(2), 1))
    return (1 - smoothing) * gold.squeeze(-1) + smoothing * log_probs.mean(-1)


def _inputs(seed, scale=1.0, dtype=torch.float32, batch=2, steps=5, states=4, dim=8):
    generator = torch.Generator().manual_seed(seed)
    make = lambda *shape: (scale * torch.randn(*shape, generator=generator, dtype=dtype)
                           ).requires_grad_()
    return (make(batch, states, dim), make(batch, steps, dim), make(VOCAB, dim), make(VOCAB),
            torch.randint(0, VOCAB, (batch, steps), generator=generator))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [True, False])
def test_factored_normalizer_equals_the_whole_tensor_in_value_and_gradient(smoothing, with_bias):
    source, target, weight, bias, targets = _inputs(int(with_bias))
    bias = bias if with_bias else None
    leaves = [t for t in (source, target, weight, bias) if t is not None]
    upstream = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(7))
    expected = _reference(source, target, weight, bias, targets, smoothing)
    expected_grads = torch.autograd.grad((expected * upstream).sum(), leaves)
    scores = linear_lexicon_log_probs(source, target, weight, bias, targets, smoothing)
    grads = torch.autograd.grad((scores * upstream).sum(), leaves)
    assert scores.shape == (2, 5, 4) and scores.dtype == torch.float32
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    with torch.no_grad():   # extraction's in-place path: the same values, inputs untouched
        copies = [t.clone() for t in leaves]
        torch.testing.assert_close(
            linear_lexicon_log_probs(source, target, weight, bias, targets, smoothing),
            scores.detach())
        assert all(torch.equal(a, b) for a, b in zip(leaves, copies))


def test_factored_normalizer_passes_gradcheck():
    source, target, weight, bias, targets = _inputs(3, dtype=torch.float64, batch=1, steps=3,
                                                    states=2, dim=3)
    assert torch.autograd.gradcheck(
        lambda *leaves: linear_lexicon_log_probs(*leaves, targets, 0.1),
        (source, target, weight, bias))


def test_large_logits_neither_overflow_nor_underflow():
    """Logits of several hundred nats (exp overflows float32 at 88): the shifted factors keep
    the result finite and equal to the float64 reference."""
    source, target, weight, bias, targets = _inputs(5, scale=6.0)
    with torch.no_grad():
        logits = F.linear(source[:, None] + target[:, :, None], weight, bias)
        assert logits.abs().max() > 200
        scores = linear_lexicon_log_probs(source, target, weight, bias, targets)
        expected = _reference(*(t.double() for t in (source, target, weight, bias)), targets,
                              0.0)
    assert torch.isfinite(scores).all()
    torch.testing.assert_close(scores.double(), expected, atol=1e-3, rtol=1e-4)


def test_every_row_is_a_distribution_over_the_vocabulary():
    source, target, weight, bias, _ = _inputs(2)
    with torch.no_grad():
        total = sum(linear_lexicon_log_probs(source, target, weight, bias,
                                             torch.full((2, 5), v)).exp() for v in range(VOCAB))
    torch.testing.assert_close(total, torch.ones(2, 5, 4))


# -- models with the linear lexicon ----------------------------------------------------------

def _model(cls, **changes):
    torch.manual_seed(0)
    values = dict(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16, n_heads=2,
                  enc_layers=1, dec_layers=2, d_ff=32, dropout=0.0, max_jump=3,
                  lexicon_activation="linear")
    values.update(changes)
    return cls(DirectHMMConfig(**values)).eval()


@pytest.mark.parametrize("cls", [ZeroOrderHMM, FirstOrderHMM])
@pytest.mark.parametrize("lexicon_dim", [0, 8])
def test_model_lexicon_is_the_unrectified_formula(cls, lexicon_dim):
    """The model's lexicon = log_softmax(W4·(W5·h_j + W6·s_i)) with no relu, tied or not, in
    training (smoothed) and in extraction."""
    model = _model(cls, lexicon_dim=lexicon_dim)
    src, tgt_in, tgt_out = tiny_batch()
    with torch.no_grad():
        _, source_hidden, target_hidden = model.decode(src, tgt_in)
        for smoothing in (0.0, 0.1):
            got = model.log_lexicon(source_hidden, target_hidden, tgt_out, smoothing)
            want = _reference(source_hidden, target_hidden, model.lexicon.weight,
                              model.lexicon.bias, tgt_out, smoothing)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        relu = _model(cls, lexicon_dim=lexicon_dim, lexicon_activation="relu")
        relu.load_state_dict(model.state_dict())
        assert not torch.allclose(relu.log_lexicon(source_hidden, target_hidden, tgt_out),
                                  got, atol=1e-3)


@pytest.mark.parametrize("cls", [ZeroOrderHMM, FirstOrderHMM])
def test_decoding_step_by_step_gives_the_training_loss(cls):
    """Translation's incremental decoder uses the same (linear) lexicon as training."""
    model = _model(cls)
    src, tgt_in, tgt_out = tiny_batch()
    with torch.no_grad():
        loss, _ = model.loss(src, tgt_in, tgt_out)
    assert teacher_forced_log_likelihood(model, src, tgt_in, tgt_out) == \
        pytest.approx(-float(loss), abs=1e-4)


def test_sampled_candidates_work_with_the_linear_lexicon():
    model = _model(FirstOrderHMM, lexicon_sample=6).train()
    loss, tokens = model.loss(*tiny_batch(), label_smoothing=0.1)
    loss.backward()
    assert torch.isfinite(loss) and int(tokens) == 6
    assert model.lexicon.weight.grad is not None


def test_unknown_activation_is_refused():
    with pytest.raises(AlignerError, match="lexicon_activation"):
        _model(ZeroOrderHMM, lexicon_activation="tanh")



@pytest.mark.parametrize("rows", [1000, 7])
def test_the_fixed_size_fallback_of_the_gpu_equals_the_exact_one(rows):
    """On a GPU the entries below the floor are found without a host sync (the `rows`
    smallest normalizers, a fixed size): the values and gradients of the CPU's exact fallback
    while at most `rows` entries are far; beyond that the rest keep the factored value."""
    from aligner.models import direct_hmm

    source, target, weight, bias, targets = _inputs(5, scale=6.0)
    with torch.no_grad():   # the case under test: some, but not all, (i, j) are far
        target_part = F.linear(target, weight, bias)
        source_part = F.linear(source, weight)
        norm = torch.matmul((target_part - target_part.amax(-1, keepdim=True)).exp(),
                            (source_part - source_part.amax(-1, keepdim=True)).exp()
                            .transpose(1, 2))
        n_far = int((norm < direct_hmm.LINEAR_LEXICON_FLOOR).sum())
    assert 7 < n_far < norm.numel()
    leaves = [source, target, weight, bias]
    exact = linear_lexicon_log_probs(source, target, weight, bias, targets, 0.1)
    fixed = linear_lexicon_log_probs(source, target, weight, bias, targets, 0.1,
                                     fallback_rows=rows)
    if rows >= n_far:
        torch.testing.assert_close(fixed, exact, atol=1e-6, rtol=1e-6)
        for got, want in zip(torch.autograd.grad(fixed.sum(), leaves),
                             torch.autograd.grad(exact.sum(), leaves)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    else:   # the 7 smallest are exact, the others as without a fallback
        unfixed = linear_lexicon_log_probs(source, target, weight, bias, targets, 0.1,
                                           fallback_rows=0)
        same = torch.isclose(fixed, exact, atol=1e-6, rtol=1e-6)
        assert int(same.sum()) >= norm.numel() - n_far + 7
        assert torch.equal(fixed[~same], unfixed[~same])
