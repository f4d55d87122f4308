"""Direct HMM models (hmm0, hmm1): losses against brute force, chunked lexicon, extraction."""
from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from aligner.constants import BOS_ID, EOS_ID, PAD_ID
from aligner.models.direct_hmm import (DirectHMMConfig, FirstOrderHMM, ZeroOrderHMM,
                                       lexicon_log_probs)
from aligner.utils import AlignerError
from quality import Bar

VOCAB = 11


def _config(**changes) -> DirectHMMConfig:
    values = dict(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16, n_heads=2,
                  enc_layers=1, dec_layers=2, d_ff=32, dropout=0.0, lexicon_chunk=2,
                  max_jump=3)
    values.update(changes)
    return DirectHMMConfig(**values)


def _model(cls, seed: int = 0, **changes):
    torch.manual_seed(seed)
    model = cls(_config(**changes))
    model.eval()
    return model


def _batch(pairs):
    """[(source ids, target ids)] -> src (B, J+1), tgt_in (B, I+1), tgt_out (B, I+1), padded."""
    src_len = max(len(s) for s, _ in pairs) + 1
    tgt_len = max(len(t) for _, t in pairs) + 1
    src = torch.full((len(pairs), src_len), PAD_ID)
    tgt_in = torch.full((len(pairs), tgt_len), PAD_ID)
    tgt_out = torch.full((len(pairs), tgt_len), PAD_ID)
    for b, (source, target) in enumerate(pairs):
        src[b, :len(source) + 1] = torch.tensor(source + [EOS_ID])
        tgt_in[b, :len(target) + 1] = torch.tensor([BOS_ID] + target)
        tgt_out[b, :len(target) + 1] = torch.tensor(target + [EOS_ID])
    return src, tgt_in, tgt_out


PAIRS = [([4, 5, 6], [7, 8]), ([9, 4], [5, 6, 10, 4]), ([8], [9])]


# -- lexicon ---------------------------------------------------------------------------------

def _lexicon_reference(source_hidden, target_hidden, weight, bias, targets, smoothing):
    """The whole (B, I, J, V) tensor, log_softmax, gather: what the chunks must reproduce."""
    logits = F.linear(F.relu(source_hidden[:, None] + target_hidden[:, :, None]), weight, bias)
    log_probs = torch.log_softmax(logits, -1)
    gold = log_probs.gather(-1, targets[:, :, None, None].expand(-1, -1, logits.size(2), 1))
    return (1 - smoothing) * gold.squeeze(-1) + smoothing * log_probs.mean(-1)


@pytest.mark.parametrize("chunk", [0, 1, 2, 3, 5, 100])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_chunked_lexicon_equals_whole_tensor_in_value_and_gradient(chunk, smoothing):
    generator = torch.Generator().manual_seed(chunk)
    source = torch.randn(2, 4, 8, generator=generator, requires_grad=True)
    target = torch.randn(2, 5, 8, generator=generator, requires_grad=True)
    weight = torch.randn(VOCAB, 8, generator=generator, requires_grad=True)
    bias = torch.randn(VOCAB, generator=generator, requires_grad=True)
    targets = torch.randint(0, VOCAB, (2, 5), generator=generator)
    upstream = torch.randn(2, 5, 4, generator=generator)
    expected = _lexicon_reference(source, target, weight, bias, targets, smoothing)
    leaves = (source, target, weight, bias)
    expected_grads = torch.autograd.grad((expected * upstream).sum(), leaves)
    scores = lexicon_log_probs(source, target, weight, bias, targets, smoothing, chunk)
    grads = torch.autograd.grad((scores * upstream).sum(), leaves)
    assert torch.allclose(scores, expected, atol=1e-5)
    for got, want in zip(grads, expected_grads):
        assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("block_rows", [1, 3, 128])
@pytest.mark.parametrize("with_bias", [True, False])
def test_inference_lexicon_on_the_cpu_equals_the_whole_tensor(block_rows, with_bias):
    """Extraction's cache-blocked path (no autograd, bias folded into W4) == the reference."""
    from aligner.models.direct_hmm import _lexicon_inference_cpu

    generator = torch.Generator().manual_seed(block_rows)
    source = torch.randn(3, 4, 8, generator=generator)
    target = torch.randn(3, 5, 8, generator=generator)
    weight = torch.randn(VOCAB, 8, generator=generator)
    bias = torch.randn(VOCAB, generator=generator) if with_bias else None
    targets = torch.randint(0, VOCAB, (3, 5), generator=generator)
    expected = _lexicon_reference(source, target, weight, bias, targets, 0.0)
    blocked = _lexicon_inference_cpu(source, target, weight, bias, targets, block_rows)
    assert torch.allclose(blocked, expected, atol=1e-5)
    with torch.no_grad():         # lexicon_log_probs takes this path without autograd
        assert torch.allclose(lexicon_log_probs(source, target, weight, bias, targets, 0.0, 2),
                              expected, atol=1e-5)


def test_lexicon_is_a_distribution_over_the_vocabulary():
    """Summing exp(score) over all possible observed words gives 1 for every (i, j)."""
    generator = torch.Generator().manual_seed(0)
    source = torch.randn(1, 3, 8, generator=generator)
    target = torch.randn(1, 2, 8, generator=generator)
    weight = torch.randn(VOCAB, 8, generator=generator)
    total = sum(lexicon_log_probs(source, target, weight, None, torch.full((1, 2), v), 0.0, 1).exp()
                for v in range(VOCAB))
    assert torch.allclose(total, torch.ones(1, 2, 3), atol=1e-5)


# -- zero order ------------------------------------------------------------------------------

def test_hmm0_loss_equals_explicit_mixture_sum():
    model = _model(ZeroOrderHMM)
    src, tgt_in, tgt_out = _batch(PAIRS)
    loss, n_tokens = model.loss(src, tgt_in, tgt_out, label_smoothing=0.1)
    with torch.no_grad():
        log_alpha, log_lexicon, _ = model.scores(src, tgt_in, tgt_out, 0.1)
    expected = 0.0
    for b, (source, target) in enumerate(PAIRS):
        for i in range(len(target) + 1):
            expected -= math.log(sum(math.exp(log_alpha[b, i, j] + log_lexicon[b, i, j])
                                     for j in range(len(source) + 1)))
    assert n_tokens.item() == sum(len(t) + 1 for _, t in PAIRS)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_hmm0_alignment_is_a_distribution_over_real_source_positions():
    model = _model(ZeroOrderHMM)
    src, tgt_in, tgt_out = _batch(PAIRS)
    for method in ZeroOrderHMM.METHODS:
        scores = model.alignment_scores(src, tgt_in, tgt_out, method)
        assert scores.shape == (3, 5, 4)
        assert torch.allclose(scores.sum(-1), torch.ones(3, 5), atol=1e-5)
        assert torch.all(scores.masked_select(src.eq(PAD_ID)[:, None, :].expand_as(scores)) == 0)


def test_hmm0_posterior_is_bayes_rule_over_alignment_and_lexicon():
    model = _model(ZeroOrderHMM)
    src, tgt_in, tgt_out = _batch(PAIRS)
    posterior = model.alignment_scores(src, tgt_in, tgt_out, "hmm-posterior")
    log_alpha, log_lexicon, _ = model.scores(src, tgt_in, tgt_out)
    joint = (log_alpha + log_lexicon).exp()
    assert torch.allclose(posterior, joint / joint.sum(-1, keepdim=True), atol=1e-5)


@pytest.mark.parametrize("cls", [ZeroOrderHMM, FirstOrderHMM])
def test_loss_of_a_sentence_does_not_depend_on_padding_or_batch_neighbours(cls):
    model = _model(cls)
    batch_loss, _ = model.loss(*_batch(PAIRS))
    alone = sum(model.loss(*_batch([pair]))[0] for pair in PAIRS)
    assert batch_loss.item() == pytest.approx(alone.item(), rel=1e-5)


@pytest.mark.parametrize("cls", [ZeroOrderHMM, FirstOrderHMM])
def test_chunking_changes_neither_loss_nor_gradient(cls):
    batch = _batch(PAIRS)
    losses, grads = [], []
    for chunk in (0, 1, 3):
        model = _model(cls, lexicon_chunk=chunk)
        loss, _ = model.loss(*batch, label_smoothing=0.1)
        loss.backward()
        losses.append(loss.item())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()
                                if p.grad is not None]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5) == pytest.approx(losses[2], rel=1e-5)
    assert torch.allclose(grads[0], grads[1], atol=1e-5)
    assert torch.allclose(grads[0], grads[2], atol=1e-5)


@pytest.mark.parametrize("cls", [ZeroOrderHMM, FirstOrderHMM])
@pytest.mark.parametrize("context", ["mlp", "attention"])
def test_alignment_at_position_i_ignores_later_target_words(cls, context):
    model = _model(cls, context=context)
    src, tgt_in, tgt_out = _batch([([4, 5, 6], [7, 8, 9])])
    log_alpha, _, _ = model.decode(src, tgt_in)
    changed = tgt_in.clone()
    changed[0, 2:] = torch.tensor([10, 10])
    log_alpha_changed, _, _ = model.decode(src, changed)
    assert torch.allclose(log_alpha[:, :2], log_alpha_changed[:, :2], atol=1e-6)
    assert not torch.allclose(log_alpha[:, 2:], log_alpha_changed[:, 2:], atol=1e-6)


# -- first order -----------------------------------------------------------------------------

def _paths(model, pair):
    """All alignment paths of one pair with their log p(path, e) from the model's own scores."""
    src, tgt_in, tgt_out = _batch([pair])
    with torch.no_grad():
        log_alpha, log_lexicon, _ = model.scores(src, tgt_in, tgt_out)
    steps, states = tgt_out.size(1), src.size(1)
    scores = {}
    for path in itertools.product(range(states), repeat=steps):
        score = log_alpha[0, 0, 0, path[0]] + log_lexicon[0, 0, path[0]]
        for i in range(1, steps):
            score = score + log_alpha[0, i, path[i - 1] + 1, path[i]] + log_lexicon[0, i, path[i]]
        scores[path] = score.item()
    return scores


@pytest.mark.parametrize("options", [{}, {"context": "attention"}, {"alignment_dim": 4},
                                     {"context": "attention", "alignment_dim": 4}])
def test_hmm1_loss_equals_brute_force_over_all_alignment_paths(options):
    """Also with the faster decoder (cross-attention context, narrower alignment features):
    the same HMM over the model's own scores."""
    model = _model(FirstOrderHMM, **options)
    pair = ([4, 5], [7, 8, 9])                     # 3 states, 4 target positions: 81 paths
    scores = _paths(model, pair)
    log_z = math.log(sum(math.exp(s) for s in scores.values()))
    loss, n_tokens = model.loss(*_batch([pair]))
    assert n_tokens.item() == 4
    assert loss.item() == pytest.approx(-log_z, rel=1e-5)


def test_hmm1_tree_forward_gives_the_same_loss_and_gradient_as_the_loop():
    batch = _batch(PAIRS)
    results = []
    for algorithm in ("loop", "tree"):
        model = _model(FirstOrderHMM, forward_algorithm=algorithm)
        loss, _ = model.loss(*batch)
        loss.backward()
        results.append((loss.item(), model.output_layer.first_order.jump.weight.grad.clone()))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-5)


def test_hmm1_transitions_are_distributions_with_a_start_state():
    model = _model(FirstOrderHMM)
    src, tgt_in, _ = _batch(PAIRS)
    log_alpha, _, _ = model.decode(src, tgt_in)
    assert log_alpha.shape == (3, 5, 5, 4)         # (B, I+1, start + J+1, J+1)
    alpha = log_alpha.exp()
    assert torch.allclose(alpha.sum(-1), torch.ones(3, 5, 5), atol=1e-5)
    assert torch.all(alpha.masked_select(src.eq(PAD_ID)[:, None, None, :].expand_as(alpha)) == 0)


def test_hmm1_posterior_equals_brute_force_marginals_even_under_inference_mode():
    model = _model(FirstOrderHMM)
    pair = ([4, 5], [7, 8, 9])
    scores = _paths(model, pair)
    log_z = math.log(sum(math.exp(s) for s in scores.values()))
    expected = torch.zeros(4, 3)
    for path, score in scores.items():
        for i, j in enumerate(path):
            expected[i, j] += math.exp(score - log_z)
    with torch.inference_mode():
        posterior = model.alignment_scores(*_batch([pair]), "hmm-posterior")
    assert torch.allclose(posterior[0], expected, atol=1e-5)
    with torch.no_grad():
        batched = model.alignment_scores(*_batch(PAIRS), "hmm-posterior")
    assert torch.allclose(batched.sum(-1), _batch(PAIRS)[2].ne(PAD_ID).float(), atol=1e-5)


def test_hmm1_viterbi_is_the_best_path_that_aligns_words_to_words():
    model = _model(FirstOrderHMM, seed=3)
    pair = ([4, 5], [7, 8, 9])
    eos = 2                                        # source EOS is state 2 of 3
    scores = _paths(model, pair)
    allowed = {p: s for p, s in scores.items() if eos not in p[:-1]}
    best = max(allowed, key=allowed.get)
    with torch.no_grad():
        one_hot = model.alignment_scores(*_batch([pair]), "hmm-viterbi")
    assert one_hot[0].argmax(-1).tolist() == list(best)
    assert torch.all(one_hot.sum(-1) == 1)
    # batched with padding: padded rows are all zero, real rows one-hot, no word on EOS
    src, tgt_in, tgt_out = _batch(PAIRS)
    with torch.no_grad():
        one_hot = model.alignment_scores(src, tgt_in, tgt_out, "hmm-viterbi")
    assert torch.equal(one_hot.sum(-1), tgt_out.ne(PAD_ID).float())
    for b, (source, target) in enumerate(PAIRS):
        assert torch.all(one_hot[b, :len(target), len(source)] == 0)


def test_hmm1_alignment_method_is_the_greedy_alpha_path():
    model = _model(FirstOrderHMM, seed=1)
    src, tgt_in, tgt_out = _batch(PAIRS)
    with torch.no_grad():
        one_hot = model.alignment_scores(src, tgt_in, tgt_out, "hmm-alignment")
        log_alpha, _, _ = model.decode(src, tgt_in)
    for b, (_, target) in enumerate(PAIRS):
        previous = 0                               # the start state row
        for i in range(len(target) + 1):
            j = log_alpha[b, i, previous].argmax().item()
            assert one_hot[b, i].argmax().item() == j and one_hot[b, i].sum() == 1
            previous = j + 1


def test_unknown_method_and_options_are_user_errors():
    model = _model(ZeroOrderHMM)
    with pytest.raises(AlignerError, match="hmm-viterbi"):
        model.alignment_scores(*_batch(PAIRS), "hmm-viterbi")
    with pytest.raises(AlignerError, match="takes no option layer"):
        model.alignment_scores(*_batch(PAIRS), "hmm-posterior", layer=3)
    with pytest.raises(AlignerError, match="takes no option shortlist"):
        model.alignment_scores(*_batch(PAIRS), "hmm-alignment", shortlist=3)
    with pytest.raises(AlignerError, match="shortlist must be an integer >= 0"):
        model.alignment_scores(*_batch(PAIRS), "hmm-posterior", shortlist=-1)
    with pytest.raises(AlignerError, match="lexicon_chunk"):
        _config(lexicon_chunk=-1)
    with pytest.raises(AlignerError, match="forward_algorithm"):
        _config(forward_algorithm="scan")
    with pytest.raises(AlignerError, match="context must be one of mlp, attention: additive"):
        _config(context="additive")
    with pytest.raises(AlignerError, match="alignment_dim must be >= 0"):
        _config(alignment_dim=-1)


def test_a_config_saved_before_the_decoder_options_loads_the_same_model():
    """config.json of a model trained before `context` and `alignment_dim` existed: the
    defaults give the same parameter names and shapes (strict state-dict load)."""
    from aligner.models import build_model

    saved = _model(FirstOrderHMM, dec_layers=3)
    old_config = saved.config.to_dict()
    del old_config["context"], old_config["alignment_dim"]
    loaded = build_model("hmm1", old_config)
    loaded.load_state_dict(saved.state_dict(), strict=True)
    assert any(name.startswith("layers.0.context.") for name in loaded.state_dict())


def test_decoder_context_and_alignment_width_set_the_layers():
    """context="attention": the lower decoder layers hold the transformer's cross-attention and
    no HMMContext; alignment_dim a: the first-order features are a wide (0 = d_model)."""
    from aligner.models.direct_hmm import HMMContext
    from aligner.models.transformer import MultiHeadAttention

    def count(model, kind):
        return sum(isinstance(m, kind) for m in model.modules())

    default = _model(FirstOrderHMM, dec_layers=3)
    assert count(default, HMMContext) == 2
    assert default.output_layer.first_order.keys(torch.zeros(1, 3, 16)).shape == (1, 4, 3, 16)
    faster = _model(FirstOrderHMM, dec_layers=3, context="attention", alignment_dim=4)
    assert count(faster, HMMContext) == 0
    assert all(isinstance(layer.cross_attn, MultiHeadAttention) for layer in faster.layers)
    assert faster.output_layer.first_order.keys(torch.zeros(1, 3, 16)).shape == (1, 4, 3, 4)
    assert sum(p.numel() for p in faster.parameters()) < sum(
        p.numel() for p in default.parameters())


def test_registry_builds_both_kinds_from_a_saved_config():
    from aligner.models import MODELS, build_model
    assert MODELS["hmm0"] is ZeroOrderHMM and MODELS["hmm1"] is FirstOrderHMM
    config = _config().to_dict()
    model = build_model("hmm1", config)
    assert isinstance(model, FirstOrderHMM) and model.config.lexicon_chunk == 2
    with pytest.raises(AlignerError, match="unknown"):
        build_model("hmm0", dict(config, lexicon_chnk=4))


def _monotone_accuracy(cls, method: str, activation: str, options: dict, seed: int) -> float:
    """Share of diagonal links after training on a word-by-word translation (id + 3) of the
    source; `seed`: initialization and data."""
    torch.manual_seed(seed)
    model = cls(_config(d_model=32, n_heads=2, d_ff=64, dec_layers=2, src_vocab_size=16,
                        tgt_vocab_size=16, lexicon_chunk=0, lexicon_activation=activation,
                        **options))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)

    def sample(n):
        pairs = []
        for _ in range(n):
            length = int(torch.randint(2, 6, (1,), generator=generator))
            source = torch.randint(4, 13, (length,), generator=generator).tolist()
            pairs.append((source, [w + 3 for w in source]))
        return pairs

    model.train()
    for _ in range(150):
        loss, n_tokens = model.loss(*_batch(sample(16)))
        optimizer.zero_grad()
        (loss / n_tokens).backward()
        optimizer.step()
    model.eval()
    pairs = sample(20)
    src, tgt_in, tgt_out = _batch(pairs)
    with torch.no_grad():
        scores = model.alignment_scores(src, tgt_in, tgt_out, method)
    correct = total = 0
    for b, (source, _) in enumerate(pairs):
        links = scores[b, :len(source), :len(source)].argmax(-1)
        correct += (links == torch.arange(len(source))).sum().item()
        total += len(source)
    return correct / total


MONOTONE_CASES = {
    "hmm0-posterior": (ZeroOrderHMM, "hmm-posterior", "relu", {}),
    "hmm1-viterbi": (FirstOrderHMM, "hmm-viterbi", "relu", {}),
    "hmm1-viterbi-linear": (FirstOrderHMM, "hmm-viterbi", "linear", {}),
    "hmm1-posterior-attention": (FirstOrderHMM, "hmm-posterior", "linear",
                                 {"context": "attention", "alignment_dim": 8})}
MONOTONE = {name: Bar(f"diagonal links of {name} on a monotone translation",
                      functools.partial(_monotone_accuracy, *case), above=0.85,
                      margin="measured 0.933-1.000 (hmm0-posterior), 0.950-1.000 (hmm1)")
            for name, case in MONOTONE_CASES.items()}
BARS = list(MONOTONE.values())


@pytest.mark.quality
@pytest.mark.parametrize("name", list(MONOTONE_CASES))
def test_training_learns_a_monotone_word_translation(name):
    """Target = word-by-word translation (id + 3) of the source: alignments become the diagonal
    (with either lexicon activation, and with the faster decoder)."""
    MONOTONE[name].check(0)


def test_inference_uses_the_viterbi_path_and_drops_eos_and_padding():
    from aligner.extract.inference import hard_alignment
    model = _model(FirstOrderHMM, seed=2)
    src, tgt_in, tgt_out = _batch(PAIRS)
    with torch.no_grad():
        path = model.alignment_path(src, tgt_in, tgt_out, "hmm-viterbi")
        hard = hard_alignment(model, src, tgt_in, tgt_out, "hmm-viterbi")
    for b, (source, target) in enumerate(PAIRS):
        assert hard[b, :len(target)].tolist() == path[b, :len(target)].tolist()
        assert torch.all(hard[b, len(target):] == -1)      # target EOS row and padding
        assert all(0 <= j < len(source) for j in hard[b, :len(target)].tolist())
    assert model.alignment_path(src, tgt_in, tgt_out, "hmm-posterior") is None


def test_lexicon_dim_gives_an_untied_smaller_lexicon_with_the_same_algebra():
    model = _model(ZeroOrderHMM, lexicon_dim=6)
    assert model.lexicon.weight.shape == (VOCAB, 6)
    assert model.lexicon.weight is not model.embed.token.weight
    tied = _model(ZeroOrderHMM)
    assert tied.lexicon.weight is tied.embed.token.weight
    src, tgt_in, tgt_out = _batch(PAIRS)
    with torch.no_grad():
        posterior = model.alignment_scores(src, tgt_in, tgt_out, "hmm-posterior")
    assert torch.allclose(posterior.sum(-1), torch.ones(3, 5), atol=1e-5)


def test_sampled_lexicon_candidates_and_loss():
    model = _model(ZeroOrderHMM, lexicon_sample=10)
    src, tgt_in, tgt_out = _batch(PAIRS)
    torch.manual_seed(5)
    candidates = model.candidate_words(tgt_out)
    observed = set(tgt_out.flatten().tolist())
    assert len(observed) == 9                      # PAD, EOS and 7 words: one drawn candidate
    assert len(candidates) == 10 and observed <= set(candidates.tolist())
    assert candidates.tolist() == sorted(set(candidates.tolist()))
    # the training loss normalizes over exactly these candidates
    model.train()
    torch.manual_seed(5)
    loss, _ = model.loss(src, tgt_in, tgt_out)
    log_alpha, source_hidden, target_hidden = model.decode(src, tgt_in)
    logits = F.linear(F.relu(source_hidden[:, None] + target_hidden[:, :, None]),
                      model.lexicon.weight[candidates], model.lexicon.bias[candidates])
    index = torch.searchsorted(candidates, tgt_out)[:, :, None, None].expand(-1, -1, 4, 1)
    log_lexicon = torch.log_softmax(logits, -1).gather(-1, index).squeeze(-1)
    expected = -(torch.logsumexp(log_alpha + log_lexicon, -1) * tgt_out.ne(PAD_ID)).sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    # all words as candidates = the exact loss; evaluation mode is always exact
    exact = _model(ZeroOrderHMM)
    full = _model(ZeroOrderHMM, lexicon_sample=VOCAB)
    full.train()
    assert full.loss(src, tgt_in, tgt_out)[0].item() == pytest.approx(
        exact.loss(src, tgt_in, tgt_out)[0].item(), rel=1e-5)
    model.eval()
    assert model.loss(src, tgt_in, tgt_out)[0].item() == pytest.approx(
        exact.loss(src, tgt_in, tgt_out)[0].item(), rel=1e-5)


@pytest.mark.parametrize("cls", [ZeroOrderHMM, FirstOrderHMM])
@pytest.mark.parametrize("null_word", [False, True])
def test_bf16_autocast_keeps_the_hmm_in_float32(cls, null_word):
    """The trainer's CUDA path runs under bf16 autocast; here the same on CPU (also with the
    empty word, whose gate and mixture run under it)."""
    model = _model(cls, null_word=null_word)
    exact, _ = model.loss(*_batch(PAIRS))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = model.loss(*_batch(PAIRS))
        scores = model.alignment_scores(*_batch(PAIRS), "hmm-posterior")
    loss.backward()
    assert loss.dtype == torch.float32 and scores.dtype == torch.float32
    assert loss.item() == pytest.approx(exact.item(), rel=1e-2)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("with_bias", [True, False])
def test_chunked_lexicon_backward_passes_gradcheck(with_bias):
    """The hand-written backward of the chunked lexicon against finite differences (float64)."""
    generator = torch.Generator().manual_seed(7)
    source = torch.randn(2, 3, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    target = torch.randn(2, 5, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    bias = (torch.randn(6, generator=generator, dtype=torch.float64, requires_grad=True)
            if with_bias else None)
    targets = torch.randint(0, 6, (2, 5), generator=generator)

    def function(source, target, weight, *bias):
        return lexicon_log_probs(source, target, weight, bias[0] if bias else None, targets,
                                 smoothing=0.2, chunk=2)

    inputs = (source, target, weight) + ((bias,) if with_bias else ())
    assert torch.autograd.gradcheck(function, inputs)


@pytest.mark.parametrize("kind,null_word,context", [("hmm0", "false", "mlp"),
                                                    ("hmm1", "false", "mlp"),
                                                    ("hmm0", "true", "mlp"),
                                                    ("hmm1", "true", "attention")])
def test_align_train_and_extract_every_method_through_the_cli(tmp_path, kind, null_word, context):
    """`align train --model hmmK -M ...` then `align extract` of each method, both directions
    (and with the empty word, and the faster decoder)."""
    import json

    from click.testing import CliRunner

    from aligner.cli import main
    from aligner.formats import read_pharaoh
    from aligner.models import MODELS
    from synthetic import monotone_corpus, write_corpus

    sources, targets, _ = monotone_corpus(30, seed=1)
    src, tgt, _ = write_corpus(tmp_path, "train", sources, targets)
    model = tmp_path / "model"

    def run(*args):
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 0, (result.output, result.exception)
        return result

    run("train", "-s", src, "-t", tgt, "-o", model, "--model", kind, "--bpe-merges", "10",
        "--d-model", "16", "--heads", "2", "--encoder-layers", "1", "--decoder-layers", "2",
        "--ff-dim", "32", "--max-tokens", "200", "--max-updates", "2", "--warmup", "1", "-q",
        "-M", "lexicon_chunk=2", "-M", "lexicon_sample=8", "-M", "lexicon_dim=8",
        "-M", f"null_word={null_word}", "-M", f"context={context}",
        *(("-M", "alignment_dim=4") if kind == "hmm1" else ()))
    config = json.loads((model / "config.json").read_text())
    assert config["models"]["fwd"]["context"] == context
    if kind == "hmm1":
        assert config["models"]["rev"]["alignment_dim"] == 4
    assert config["models"]["fwd"]["lexicon_chunk"] == 2
    assert config["models"]["rev"]["null_word"] == (null_word == "true")
    assert config["models"]["rev"]["lexicon_dim"] == 8
    for method in MODELS[kind].METHODS:
        for direction in ("fwd", "rev", "both"):
            output = tmp_path / f"{method}.{direction}.txt"
            run("extract", model, "-s", src, "-t", tgt, "--method", method, "--direction",
                direction, "-o", output, "-q")
            alignments = read_pharaoh(str(output))
            assert len(alignments) == len(sources)
            for links, source, target in zip(alignments, sources, targets):
                assert all(i < len(source) and j < len(target) for i, j in links)
    # no -H: the HMMs' best heuristic, soft-average (the transformer keeps grow-diag)
    for heuristic in ("soft-average", "grow-diag"):
        run("extract", model, "-s", src, "-t", tgt, "-H", heuristic, "-o",
            tmp_path / f"{heuristic}.txt", "-q")
    run("extract", model, "-s", src, "-t", tgt, "-o", tmp_path / "default.txt", "-q")
    assert (tmp_path / "default.txt").read_text() == (tmp_path / "soft-average.txt").read_text()
    assert (tmp_path / "grow-diag.txt").read_text() != (tmp_path / "soft-average.txt").read_text()


def test_hmm_context_is_the_alpha_weighted_sum_outside_the_nonlinearity():
    """c_i = Σ_j α_h(j|i) · W1·relu(W2·h_j + W3·s_i), per head slice, computed with loops."""
    from aligner.models.direct_hmm import HMMContext
    torch.manual_seed(0)
    layer = HMMContext(d_model=8, n_heads=2, dropout=0.0).eval()
    s, memory = torch.randn(2, 3, 8), torch.randn(2, 4, 8)
    pad = torch.tensor([[False] * 4, [False, False, True, True]])
    with torch.no_grad():
        context, alpha = layer(s, memory, pad)
        assert torch.allclose(alpha.sum(-1), torch.ones(2, 2, 3), atol=1e-6)
        assert torch.all(alpha[1, :, :, 2:] == 0)
        for b in range(2):
            for i in range(3):
                mixed = torch.zeros(8)
                for j in range(4):
                    feature = F.relu(layer.w2(memory[b, j]) + layer.w3(s[b, i]))
                    for h in range(2):
                        head = slice(4 * h, 4 * h + 4)
                        mixed[head] += alpha[b, h, i, j] * feature[head]
                assert torch.allclose(context[b, i], layer.w1(mixed), atol=1e-5)


def test_sampled_candidates_keep_every_observed_word_when_the_sample_is_smaller():
    model = _model(ZeroOrderHMM, lexicon_sample=3)
    _, _, tgt_out = _batch(PAIRS)
    candidates = model.candidate_words(tgt_out)
    assert candidates.tolist() == sorted(set(tgt_out.flatten().tolist()))


LONG_PAIRS = [([4, 5, 6, 7, 8, 9], [7, 8, 9, 10, 4]), ([9, 4], [5, 6, 10, 4, 5, 6, 7]), ([8], [9])]


@pytest.mark.parametrize("floats", [1, 200, 2000])
def test_hmm1_transition_chunks_change_neither_loss_nor_gradient(floats):
    """chunk_floats bounds the (B, I+1, J+2, J+1) transition scores; a batch larger than the
    budget is computed in chunks of target positions (recomputed in backward): same values."""
    src, tgt_in, tgt_out = _batch(LONG_PAIRS)
    results = []
    for chunk_floats in (0, floats):
        model = _model(FirstOrderHMM, chunk_floats=chunk_floats)
        model.train()
        loss, _ = model.loss(src, tgt_in, tgt_out, label_smoothing=0.1)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (whole, whole_grads), (chunked, chunked_grads) = results
    assert torch.allclose(whole, chunked, rtol=1e-6)
    for name, grad in whole_grads.items():
        assert torch.allclose(grad, chunked_grads[name], rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("method", ["hmm-posterior", "hmm-viterbi", "hmm-alignment"])
def test_hmm1_extraction_in_transition_chunks_equals_whole(method):
    src, tgt_in, tgt_out = _batch(LONG_PAIRS)
    whole = _model(FirstOrderHMM, chunk_floats=0).alignment_scores(src, tgt_in, tgt_out, method)
    model = _model(FirstOrderHMM, chunk_floats=400)   # 2-position chunks of 3 x 8 x 7 floats
    assert model.decode(src, tgt_in, lazy=True)[0].chunk(400) == 2
    chunked = model.alignment_scores(src, tgt_in, tgt_out, method)
    assert torch.allclose(whole, chunked, atol=1e-6)


def test_hmm1_posterior_by_forward_backward_equals_autograd_of_log_z():
    """Extraction's explicit forward–backward == ∂ log Z / ∂ log p_lex (the definition)."""
    model = _model(FirstOrderHMM)
    src, tgt_in, tgt_out = _batch(LONG_PAIRS)
    with torch.no_grad():
        log_alpha, log_lexicon, _ = model.scores(src, tgt_in, tgt_out)
    emission = log_lexicon.clone().requires_grad_(True)
    expected = torch.autograd.grad(model.log_z(log_alpha, emission, src, tgt_out).sum(),
                                   emission)[0]
    gamma = model.alignment_scores(src, tgt_in, tgt_out, "hmm-posterior")
    assert torch.allclose(gamma, expected, atol=1e-5)


@pytest.mark.parametrize("cls", [ZeroOrderHMM, FirstOrderHMM])
def test_lexicon_shortlist_normalizes_over_frequent_and_observed_words_only(cls):
    """shortlist=N: p_lex(e_i|j) = exp(logit e_i) / Σ over ids < N and the batch's words; a
    shortlist covering the vocabulary is the exact lexicon."""
    model = _model(cls)
    src, tgt_in, tgt_out = _batch(PAIRS)
    with torch.no_grad():
        _, source_hidden, target_hidden = model.decode(src, tgt_in)
        exact = model.log_lexicon(source_hidden, target_hidden, tgt_out)
        short = model.log_lexicon(source_hidden, target_hidden, tgt_out, shortlist=5)
        full = model.log_lexicon(source_hidden, target_hidden, tgt_out, shortlist=VOCAB)
        hidden = F.relu(source_hidden[:, None] + target_hidden[:, :, None])
        logits = model.lexicon(hidden)                                   # (B, I+1, J+1, V)
    keep = torch.zeros(VOCAB, dtype=torch.bool)
    keep[:5] = True
    keep[tgt_out.flatten()] = True
    expected = logits.gather(-1, tgt_out[:, :, None, None].expand(-1, -1, logits.size(2), 1)
                             ).squeeze(-1) - torch.logsumexp(logits[..., keep], -1)
    assert torch.allclose(short, expected, atol=1e-5)
    assert torch.all(short >= exact - 1e-6)            # fewer terms: a smaller normalizer
    assert torch.allclose(full, exact, atol=1e-6)
    for method in ("hmm-posterior",) + (("hmm-viterbi",) if cls is FirstOrderHMM else ()):
        scores = model.alignment_scores(src, tgt_in, tgt_out, method, shortlist=VOCAB)
        assert torch.allclose(scores, model.alignment_scores(src, tgt_in, tgt_out, method),
                              atol=1e-6)


@pytest.mark.parametrize("cls", [ZeroOrderHMM, FirstOrderHMM])
def test_linear_lexicon_shortlist_is_per_sentence_whatever_its_batch(cls):
    """The linear lexicon's shortlist=N: sentence b's p_lex(e_i|j) normalizes over the ids < N
    and b's own target words (brute force over the (B, I, J, V) logits), so a sentence gets
    the same posteriors alone as beside other sentences."""
    model = _model(cls, lexicon_activation="linear", lexicon_dim=8)
    src, tgt_in, tgt_out = _batch(PAIRS)
    with torch.no_grad():
        _, source_hidden, target_hidden = model.decode(src, tgt_in)
        short = model.log_lexicon(source_hidden, target_hidden, tgt_out, shortlist=5)
        logits = model.lexicon(source_hidden[:, None] + target_hidden[:, :, None])
    for b in range(len(PAIRS)):
        keep = torch.zeros(VOCAB, dtype=torch.bool)
        keep[:5] = True
        keep[tgt_out[b]] = True
        expected = logits[b].gather(-1, tgt_out[b, :, None, None].expand(
            -1, logits.size(2), 1)).squeeze(-1) - torch.logsumexp(logits[b][..., keep], -1)
        assert torch.allclose(short[b], expected, atol=1e-5)
    together = model.alignment_scores(src, tgt_in, tgt_out, "hmm-posterior", shortlist=5)
    for b, pair in enumerate(PAIRS):
        alone = model.alignment_scores(*_batch([pair]), "hmm-posterior", shortlist=5)
        rows, columns = alone.shape[1:]
        assert torch.allclose(together[b, :rows, :columns], alone[0], atol=1e-6)


@pytest.mark.parametrize("dim", [0, 3])
def test_first_order_scores_equal_the_key_side_formula(dim):
    """W_o applied to the queries (I·a²) instead of the J·(J+1) keys (J²·a²): the same
    log α as q_i · W_o·relu(W_a·h_j + W_b·h_j' + D[jump]) / √a, softmax over j (features of
    width a = d_model or `dim`)."""
    from aligner.models.direct_hmm import FirstOrderAlignment

    torch.manual_seed(3)
    layer = FirstOrderAlignment(8, max_jump=2, dim=dim)
    width = dim or 8
    memory, s_prev = torch.randn(2, 5, 8), torch.randn(2, 4, 8)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    got = layer(s_prev, memory, mask)                                     # (B, I, J+1, J)
    keys = layer.w_o(layer.keys(memory))                                  # W_o on every key
    assert keys.shape == (2, 6, 5, width)
    scores = torch.einsum("bid,bkjd->bikj", layer.query(s_prev), keys) / math.sqrt(width)
    want = torch.log_softmax(scores.masked_fill(mask[:, None, None, :], float("-inf")), -1)
    assert got.shape == (2, 4, 6, 5)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # and the same gradients
    weights = torch.randn(got.shape).masked_fill(mask[:, None, None, :], 0.0)
    parameters = list(layer.parameters())
    got_grads = torch.autograd.grad((got.masked_fill(got.isinf(), 0) * weights).sum(),
                                    parameters)
    want_grads = torch.autograd.grad((want.masked_fill(want.isinf(), 0) * weights).sum(),
                                     parameters)
    for name, got_grad, want_grad in zip(dict(layer.named_parameters()), got_grads, want_grads):
        torch.testing.assert_close(got_grad, want_grad, atol=1e-5, rtol=1e-4, msg=name)
    # without autograd the bias term q_i·b_o, constant over j, is left out: the same log α;
    # and log=False gives α itself
    layer.w_o.bias.data.normal_(std=3.0)
    want = layer(s_prev, memory, mask)
    with torch.no_grad():
        queries, offsets = layer.queries(s_prev)
        assert offsets is None
        torch.testing.assert_close(layer(s_prev, memory, mask), want, atol=1e-5, rtol=1e-5)
        probs = layer.log_probs(queries, None, layer.keys(memory), mask, log=False)
    torch.testing.assert_close(probs, want.exp(), atol=1e-6, rtol=1e-5)


# -- the empty word (config.null_word) ---------------------------------------------------------

def _null_model(cls, gate_bias: float = 0.0, seed: int = 0):
    """A model with the empty word whose gate starts at p0 = σ(gate_bias) for every word (the
    gate's weight gets small random values, so p0 also varies with the position)."""
    model = _model(cls, seed=seed, null_word=True)
    with torch.no_grad():
        model.null_gate.bias.fill_(gate_bias)
        model.null_gate.weight.normal_(0.0, 0.5)
    return model


def test_empty_word_emission_is_the_gated_mixture_of_the_lexicon_and_the_empty_words():
    """emission(i, j) = log((1 − p0_i)·p_lex(e_i|j) + p0_i·p_lex(e_i|∅)), all three pieces
    recomputed from the model's parameters by hand (the relu lexicon, whole vocabulary)."""
    model = _null_model(FirstOrderHMM)
    src, tgt_in, tgt_out = _batch(PAIRS)
    with torch.no_grad():
        _, emission, link = model.scores(src, tgt_in, tgt_out)
        _, source_hidden, target_hidden = model.decode(src, tgt_in)
        p0 = torch.sigmoid(model.null_gate(target_hidden))                       # (B, I+1, 1)

        def lexicon(source):                                                     # (B, I+1, J')
            logits = model.lexicon(F.relu(source[:, None] + target_hidden[:, :, None]))
            log_probs = torch.log_softmax(logits, -1)
            return log_probs.gather(-1, tgt_out[:, :, None, None].expand(
                -1, -1, source.size(1), 1)).squeeze(-1)
        by_position = lexicon(source_hidden).exp()
        empty = lexicon(model.null_source.expand(len(PAIRS), 1, -1)).exp()       # (B, I+1, 1)
    assert torch.allclose(link.exp(), (1 - p0) * by_position, atol=1e-6)
    assert torch.allclose(emission.exp(), (1 - p0) * by_position + p0 * empty, atol=1e-6)


def test_empty_word_with_a_closed_gate_is_the_model_without_it():
    """p0 → 0: loss, posteriors and translation probabilities of the plain model."""
    plain = _model(FirstOrderHMM)
    gated = _model(FirstOrderHMM, null_word=True)
    missing = gated.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["null_gate.bias", "null_gate.weight", "null_source"]
    with torch.no_grad():
        gated.null_gate.bias.fill_(-60.0)
    batch = _batch(PAIRS)
    assert gated.loss(*batch)[0].item() == pytest.approx(plain.loss(*batch)[0].item(), rel=1e-6)
    assert torch.allclose(gated.alignment_scores(*batch, "hmm-posterior"),
                          plain.alignment_scores(*batch, "hmm-posterior"), atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_hmm1_empty_word_posterior_equals_brute_force_over_paths(seed):
    """log Z = log Σ_paths p(path, e) with the mixed emission; the link posterior
    γ_link(i, j) = Σ_{paths through j at i} p(path | e) · (1 − p0_i)·p_lex(e_i|j) / p(e_i|j)
    — from extraction's forward–backward and from training's autograd (guide, agreement)."""
    model = _null_model(FirstOrderHMM, seed=seed)
    pair = ([4, 5], [7, 8, 9])                     # 3 states, 4 target positions: 81 paths
    batch = _batch([pair])
    with torch.no_grad():
        log_alpha, emission, link = model.scores(*batch)
    share = (link - emission).exp()[0]                                           # (I+1, J+1)
    paths = {}
    for path in itertools.product(range(3), repeat=4):
        score = log_alpha[0, 0, 0, path[0]] + emission[0, 0, path[0]]
        for i in range(1, 4):
            score = score + log_alpha[0, i, path[i - 1] + 1, path[i]] + emission[0, i, path[i]]
        paths[path] = score.item()
    log_z = math.log(sum(math.exp(s) for s in paths.values()))
    expected = torch.zeros(4, 3)
    for path, score in paths.items():
        for i, j in enumerate(path):
            expected[i, j] += math.exp(score - log_z) * share[i, j]
    assert model.loss(*batch)[0].item() == pytest.approx(-log_z, rel=1e-5)
    with torch.no_grad():
        extracted = model.alignment_scores(*batch, "hmm-posterior")[0]
    trained = model.training_terms(*batch, posterior=True)[2].exp()[0].detach()
    assert torch.allclose(extracted, expected, atol=1e-5)
    assert torch.allclose(trained, expected, atol=1e-5)
    assert torch.all(expected.sum(-1) < 0.999)     # a share of every word goes to the empty word


def test_hmm0_empty_word_posterior_is_bayes_rule_with_the_link_share():
    model = _null_model(ZeroOrderHMM)
    src, tgt_in, tgt_out = _batch(PAIRS)
    with torch.no_grad():
        log_alpha, emission, link = model.scores(src, tgt_in, tgt_out)
        posterior = model.alignment_scores(src, tgt_in, tgt_out, "hmm-posterior")
    marginal = (log_alpha + emission).exp().sum(-1, keepdim=True)
    assert torch.allclose(posterior, (log_alpha + link).exp() / marginal, atol=1e-6)
    trained = model.training_terms(src, tgt_in, tgt_out, posterior=True)[2].exp().detach()
    assert torch.allclose(trained.masked_fill(src.eq(PAD_ID)[:, None, :], 0.0), posterior,
                          atol=1e-6)


def test_hmm1_viterbi_leaves_words_the_empty_word_emitted_unaligned():
    """Gate wide open (p0 ≈ 1): every real target word is unaligned; nearly shut: none is."""
    batch = _batch(PAIRS)
    target_words = batch[2].ne(PAD_ID) & batch[2].ne(EOS_ID)
    for bias, unaligned in ((40.0, True), (-40.0, False)):
        model = _null_model(FirstOrderHMM, gate_bias=bias)
        with torch.no_grad():
            path = model.alignment_path(*batch, "hmm-viterbi")
        assert torch.all(path.masked_select(target_words).eq(-1) == unaligned)


def test_first_order_keys_take_their_gradient_contiguous_with_the_same_values(monkeypatch):
    """The keys' gradient arrives from the scores' product as a transposed view; a hook
    makes it contiguous before the relu's backward (a speed matter: the strided backward takes
    over twice as long). The gradient of every parameter, of the guided loss too (double
    backward through the posterior), is the same bit for bit with and without the hook."""
    from aligner.models import direct_hmm

    seen = []
    original = direct_hmm._contiguous_gradient

    def recording(gradient):
        result = original(gradient)
        seen.append((gradient.is_contiguous(), result.is_contiguous()))
        return result

    src, tgt_in, tgt_out = _batch(PAIRS)

    def gradients():
        model = _model(FirstOrderHMM, seed=5, alignment_dim=4)
        model.train()
        loss, _, log_posterior = model.training_terms(src, tgt_in, tgt_out, 0.1,
                                                      posterior=True)
        guide = torch.rand(log_posterior.shape, generator=torch.Generator().manual_seed(0))
        total = loss - (guide * log_posterior.clamp_min(-30)).sum()
        return torch.autograd.grad(total, list(model.parameters()), allow_unused=True)

    monkeypatch.setattr(direct_hmm, "_contiguous_gradient", recording)
    with_hook = gradients()
    assert seen and all(after for _, after in seen)
    assert not all(before for before, _ in seen)       # the view it replaces is strided
    monkeypatch.setattr(direct_hmm, "_contiguous_gradient", lambda gradient: gradient)
    without = gradients()
    for got, want in zip(with_hook, without):
        assert (got is None) == (want is None)
        if got is not None:
            assert torch.equal(got, want)


def test_hmm_context_features_are_float32_in_cpu_bf16_inference(monkeypatch):
    """Under bfloat16 autocast without autograd on the CPU the context's (B, I, H, J, d/H)
    features are built in float32 (the CPU converts bfloat16 for every element-wise
    operation); in training they stay in the autocast dtype. The output is close to the
    float32 model's either way."""
    from aligner.models import direct_hmm
    from aligner.models.direct_hmm import HMMContext

    torch.manual_seed(0)
    context = HMMContext(16, 2, 0.0).eval()
    s, memory = torch.randn(3, 5, 16), torch.randn(3, 4, 16)
    pad = torch.tensor([[False] * 4, [False, False, False, True], [False, False, True, True]])
    seen = []
    relu = F.relu
    monkeypatch.setattr(direct_hmm.F, "relu",
                        lambda x, inplace=False: seen.append(x.dtype) or relu(x, inplace))
    with torch.no_grad():
        exact, _ = context(s, memory, pad)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fast, _ = context(s, memory, pad)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trained, _ = context(s, memory, pad)
    assert seen == [torch.float32, torch.float32, torch.bfloat16]
    torch.testing.assert_close(fast.float(), exact, atol=0.05, rtol=0.05)
    torch.testing.assert_close(trained.float(), exact, atol=0.05, rtol=0.05)
