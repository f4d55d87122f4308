"""Alignment layer (Zenkel et al. 2019) and attention optimization.

Part 1: the layer and the optimization over plain tensors (hand-computed gradients, masking,
independence of positions). Part 2: the model on a tiny frozen transformer (base stays
bit-identical while the layer trains, `layer-sgd` with 0 steps equals `layer`). Part 3: the
CLI round trip.
"""
from __future__ import annotations

import functools

import pytest
import torch

from aligner.constants import EOS_ID, PAD_ID
from aligner.models.alignment_layer import (AlignmentLayer, combine_keys, optimize_attention,
                                            random_attention, source_mask, target_log_probs)
from aligner.utils import AlignerError
from quality import Bar

#: the learned-quality bars of this module (tests/quality.py; eval/test_margins.py)
BARS = []

VOCAB = 11
D = 8


def _layer(seed: int = 0, d: int = D, vocab: int = VOCAB) -> AlignmentLayer:
    torch.manual_seed(seed)
    layer = AlignmentLayer(d, vocab, dropout=0.0)
    return layer.eval()


def _batch():
    """Two sentence pairs: source lengths 3 and 1 (+EOS, padded), target lengths 2 and 3 (+EOS)."""
    src = torch.tensor([[5, 6, 7, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID]])
    tgt_out = torch.tensor([[4, 9, EOS_ID, PAD_ID], [10, 4, 5, EOS_ID]])
    torch.manual_seed(1)
    states = torch.randn(2, 4, D)
    source = torch.randn(2, 4, D)
    return src, tgt_out, states, source


# ---------------------------------------------------------------- layer over plain tensors

def test_source_mask_excludes_eos_and_padding():
    src, *_ = _batch()
    assert source_mask(src).tolist() == [[[True, True, True, False]], [[True, False, False, False]]]


def test_combine_keys():
    word, enc = torch.ones(1, 2, 3), torch.full((1, 2, 3), 3.0)
    assert torch.equal(combine_keys(word, enc, "word"), word)
    assert torch.equal(combine_keys(word, enc, "enc"), enc)
    assert torch.equal(combine_keys(word, enc, "add"), torch.full((1, 2, 3), 2.0))
    with pytest.raises(ValueError):
        combine_keys(word, enc, "sum")


def test_attention_is_a_distribution_over_real_source_words():
    src, _, states, source = _batch()
    weights = _layer().attention(states, source, source_mask(src))
    assert weights.shape == (2, 4, 4)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4))
    assert (weights[0, :, 3] == 0).all()          # EOS
    assert (weights[1, :, 1:] == 0).all()         # EOS and padding
    assert torch.allclose(weights[1, :, 0], torch.ones(4))  # one real word gets everything


def test_attention_matches_explicit_formula():
    src, _, states, source = _batch()
    layer = _layer()
    weights = layer.attention(states, source, source_mask(src))
    q = states[0] @ layer.query.weight.T + layer.query.bias
    k = source[0, :3] @ layer.key.weight.T + layer.key.bias
    expected = torch.softmax(q @ k.T / D ** 0.5, dim=-1)
    assert torch.allclose(weights[0, :, :3], expected, atol=1e-6)


def test_empty_source_gives_zero_attention_not_nan():
    src = torch.tensor([[EOS_ID, PAD_ID]])
    weights = _layer().attention(torch.randn(1, 3, D), torch.randn(1, 2, D), source_mask(src))
    assert torch.equal(weights, torch.zeros(1, 3, 2))


def test_forward_logits_are_output_projection_of_context():
    src, _, states, source = _batch()
    layer = _layer()
    logits, weights = layer(states, source, source_mask(src))
    context = weights @ (source @ layer.value.weight.T + layer.value.bias)
    assert torch.allclose(logits, context @ layer.output.weight.T + layer.output.bias, atol=1e-5)


def test_target_log_probs_pick_the_target_word_and_zero_padding():
    src, tgt_out, states, source = _batch()
    layer = _layer()
    with torch.no_grad():
        weights = layer.attention(states, source, source_mask(src))
        values = layer.values(source)
    picked = target_log_probs(layer, weights, values, tgt_out)
    full = torch.log_softmax(layer.output_logits(weights, values), -1)
    picked, full = picked.detach(), full.detach()
    assert picked[0, 1] == pytest.approx(full[0, 1, 9].item())
    assert picked[1, 3] == pytest.approx(full[1, 3, EOS_ID].item())
    assert picked[0, 3] == 0.0


# ---------------------------------------------------------------- attention optimization

def test_zero_steps_return_the_initial_attention():
    src, tgt_out, states, source = _batch()
    layer = _layer()
    allowed = source_mask(src)
    weights = layer.attention(states, source, allowed)
    optimized = optimize_attention(layer, weights, layer.values(source), tgt_out, allowed, steps=0)
    assert torch.equal(optimized, weights)


def test_one_step_equals_hand_computed_gradient():
    """d log p(e)/d A_j = (v_j W_o^T)·(onehot(e) − p) where relu(A_j) > 0, else 0."""
    layer = _layer(seed=3, d=2, vocab=3)
    src = torch.tensor([[5, 6, 7, EOS_ID]])
    tgt_out = torch.tensor([[2]])
    values = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [-1.0, 1.0], [5.0, 5.0]]])
    init = torch.tensor([[[0.5, -0.2, 0.3, 0.0]]])          # position 1 inactive under relu
    allowed = source_mask(src)
    step = optimize_attention(layer, init, values, tgt_out, allowed, steps=1, lr=0.5)

    context = 0.5 * values[0, 0] + 0.3 * values[0, 2]
    probs = torch.softmax(layer.output.weight @ context + layer.output.bias, -1)
    direction = torch.nn.functional.one_hot(torch.tensor(2), 3).float() - probs
    gradient = (values[0] @ layer.output.weight.T) @ direction   # (J+1,)
    expected = init[0, 0] + 0.5 * gradient * torch.tensor([1.0, 0.0, 1.0, 0.0])
    expected[3] = 0.0                                             # EOS held at zero
    assert torch.allclose(step[0, 0], expected, atol=1e-6)


def test_steps_raise_the_target_word_probability():
    src, tgt_out, states, source = _batch()
    layer = _layer()
    allowed = source_mask(src)
    weights = layer.attention(states, source, allowed)
    values = layer.values(source)
    before = target_log_probs(layer, weights, values, tgt_out)
    real = tgt_out != PAD_ID
    # a small step raises every single position's probability (first-order ascent) ...
    small = optimize_attention(layer, weights, values, tgt_out, allowed, steps=1, lr=0.01)
    after_small = target_log_probs(layer, torch.relu(small), values, tgt_out)
    assert (after_small[real] > before[real]).all()
    # ... and the default 3 steps of rate 1 raise it a lot in total
    optimized = optimize_attention(layer, weights, values, tgt_out, allowed)
    after = target_log_probs(layer, torch.relu(optimized), values, tgt_out)
    assert after[real].sum() > before[real].sum() + 1.0
    assert (after[real] >= before[real]).float().mean() > 0.8


def test_masked_columns_stay_zero_and_layer_is_unchanged():
    src, tgt_out, states, source = _batch()
    layer = _layer()
    snapshot = {k: v.clone() for k, v in layer.state_dict().items()}
    allowed = source_mask(src)
    init = torch.rand(2, 4, 4) + 0.5                            # nonzero everywhere on purpose
    optimized = optimize_attention(layer, init, layer.values(source), tgt_out, allowed, steps=5)
    assert (optimized[0, :, 3] == 0).all() and (optimized[1, :, 1:] == 0).all()
    assert all(torch.equal(snapshot[k], v) for k, v in layer.state_dict().items())
    assert all(p.grad is None for p in layer.parameters())


def test_positions_and_sentences_are_optimized_independently():
    """Optimizing one target position of one sentence alone gives the same row as the batch."""
    src, tgt_out, states, source = _batch()
    layer = _layer()
    allowed = source_mask(src)
    weights = layer.attention(states, source, allowed)
    values = layer.values(source)
    together = optimize_attention(layer, weights, values, tgt_out, allowed, steps=3)
    for b in range(2):
        for i in range(4):
            if tgt_out[b, i] == PAD_ID:
                continue
            alone = optimize_attention(layer, weights[b:b + 1, i:i + 1], values[b:b + 1],
                                       tgt_out[b:b + 1, i:i + 1], allowed[b:b + 1], steps=3)
            assert torch.allclose(alone[0, 0], together[b, i], atol=1e-5)


def test_optimization_works_under_no_grad_and_inference_mode():
    src, tgt_out, states, source = _batch()
    layer = _layer()
    allowed = source_mask(src)
    weights = layer.attention(states, source, allowed).detach()
    values = layer.values(source).detach()
    reference = optimize_attention(layer, weights, values, tgt_out, allowed)
    with torch.no_grad():
        assert torch.equal(optimize_attention(layer, weights, values, tgt_out, allowed), reference)
    with torch.inference_mode():
        w, v, t, a = weights.clone(), values.clone(), tgt_out.clone(), allowed.clone()
        assert torch.equal(optimize_attention(layer, w, v, t, a), reference)


def test_negative_steps_are_a_user_error():
    src, tgt_out, states, source = _batch()
    layer = _layer()
    with pytest.raises(AlignerError, match="sgd-steps"):
        optimize_attention(layer, torch.zeros(2, 4, 4), layer.values(source), tgt_out,
                           source_mask(src), steps=-1)


def test_random_attention_is_seeded_uniform_and_masked():
    src, *_ = _batch()
    allowed = source_mask(src)
    first = random_attention((2, 4, 4), allowed, seed=7)
    assert torch.equal(first, random_attention((2, 4, 4), allowed, seed=7))
    assert not torch.equal(first, random_attention((2, 4, 4), allowed, seed=8))
    assert (first >= 0).all() and (first < 1).all()
    assert (first[0, :, 3] == 0).all() and (first[1, :, 1:] == 0).all()


# ---------------------------------------------------------------- the model on a tiny base

def _model(keys: str = "add", seed: int = 0, dropout: float = 0.3):
    from aligner.models.alignment_layer import AlignmentLayerConfig, AlignmentLayerModel
    torch.manual_seed(seed)
    config = AlignmentLayerConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16,
                                  n_heads=2, enc_layers=1, dec_layers=2, d_ff=32,
                                  dropout=dropout, layer_keys=keys)
    return AlignmentLayerModel(config)


def _ids():
    """src (B, J+1) = ids + EOS, tgt_in = BOS + ids, tgt_out = ids + EOS (padded)."""
    from aligner.constants import BOS_ID
    src = torch.tensor([[5, 6, 7, EOS_ID], [8, 9, EOS_ID, PAD_ID]])
    tgt_out = torch.tensor([[4, 9, 10, EOS_ID], [6, EOS_ID, PAD_ID, PAD_ID]])
    tgt_in = torch.tensor([[BOS_ID, 4, 9, 10], [BOS_ID, 6, EOS_ID, PAD_ID]])
    tgt_in[1, 2] = PAD_ID
    return src, tgt_in, tgt_out


def test_only_the_layer_is_trainable_and_base_stays_in_eval_mode():
    model = _model()
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(name.startswith("layer.") for name in trainable)
    model.train()
    assert model.training and model.layer.training
    assert not any(module.training for module in model.base.modules())


def _train_layer(keys: str, seed: int):
    """30 steps of the layer on one batch of 6 target tokens: (model, the base's and the
    layer's state before, the per-token losses)."""
    model = _model(keys, seed=seed)
    base_before = {k: v.clone() for k, v in model.base.state_dict().items()}
    layer_before = {k: v.clone() for k, v in model.layer.state_dict().items()}
    src, tgt_in, tgt_out = _ids()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)
    model.train()
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss, n_tokens = model.loss(src, tgt_in, tgt_out, label_smoothing=0.1)
        (loss / n_tokens).backward()
        optimizer.step()
        losses.append(loss.item() / n_tokens.item())
    assert n_tokens.item() == 6
    return model, base_before, layer_before, losses


def _layer_loss_ratio(keys: str, seed: int) -> float:
    losses = _train_layer(keys, seed)[3]
    return losses[-1] / losses[0]


LAYER_LOSS = {keys: Bar(f"layer ({keys} keys) loss after 30 steps / before",
                        functools.partial(_layer_loss_ratio, keys), below=0.65,
                        margin="measured 0.335-0.510 (word keys 0.347-0.510)")
              for keys in ("word", "enc", "add")}
BARS += list(LAYER_LOSS.values())


@pytest.mark.quality
@pytest.mark.parametrize("keys", ["word", "enc", "add"])
def test_layer_trains_while_base_stays_bit_identical(keys):
    model, base_before, layer_before, losses = _train_layer(keys, 0)
    assert LAYER_LOSS[keys].passes(losses[-1] / losses[0]), (losses, LAYER_LOSS[keys].margin)
    assert all(torch.equal(base_before[k], v) for k, v in model.base.state_dict().items())
    assert all(p.grad is None for p in model.base.parameters())
    assert any(not torch.equal(layer_before[k], v) for k, v in model.layer.state_dict().items())


def test_base_features_ignore_training_mode():
    model = _model(dropout=0.5)
    src, tgt_in, _ = _ids()
    model.train()
    states_train, source_train, _ = model._features(src, tgt_in)
    model.eval()
    states_eval, source_eval, _ = model._features(src, tgt_in)
    assert torch.equal(states_train, states_eval) and torch.equal(source_train, source_eval)


def test_layer_scores_are_the_attention_and_never_point_at_eos_or_padding():
    model = _model().eval()
    src, tgt_in, tgt_out = _ids()
    scores = model.alignment_scores(src, tgt_in, tgt_out, "layer")
    assert scores.shape == (2, 4, 4)
    assert torch.allclose(scores.sum(-1), torch.ones(2, 4))
    assert (scores[0, :, 3] == 0).all() and (scores[1, :, 2:] == 0).all()
    _, weights = model.layer_forward(src, tgt_in)
    assert torch.equal(scores, weights)


def test_layer_sgd_with_zero_steps_equals_layer():
    model = _model().eval()
    src, tgt_in, tgt_out = _ids()
    layer = model.alignment_scores(src, tgt_in, tgt_out, "layer")
    sgd0 = model.alignment_scores(src, tgt_in, tgt_out, "layer-sgd", sgd_steps=0)
    assert torch.equal(layer, sgd0)


def test_layer_sgd_raises_the_target_word_probability_of_the_model():
    model = _model().eval()
    src, tgt_in, tgt_out = _ids()
    states, source, allowed = model._features(src, tgt_in)
    values = model.layer.values(source).detach()
    real = tgt_out != PAD_ID
    before = target_log_probs(model.layer, model.alignment_scores(src, tgt_in, tgt_out, "layer"),
                              values, tgt_out)
    for init in ("forward", "random"):
        optimized = model.alignment_scores(src, tgt_in, tgt_out, "layer-sgd", init=init)
        after = target_log_probs(model.layer, torch.relu(optimized), values, tgt_out)
        assert after[real].sum() > before[real].sum()


def test_options_arrive_as_text_or_json_values():
    """`align extract -O sgd_steps=2 -O init=random` gives ints or strings; None = default."""
    model = _model().eval()
    src, tgt_in, tgt_out = _ids()
    typed = model.alignment_scores(src, tgt_in, tgt_out, "layer-sgd", sgd_steps=2, sgd_lr=0.5)
    text = model.alignment_scores(src, tgt_in, tgt_out, "layer-sgd", sgd_steps="2", sgd_lr="0.5",
                                  init=None, seed=None)
    assert torch.equal(typed, text)
    default = model.alignment_scores(src, tgt_in, tgt_out, "layer-sgd")
    explicit = model.alignment_scores(src, tgt_in, tgt_out, "layer-sgd", sgd_steps=3, sgd_lr=1,
                                      init="forward")
    assert torch.equal(default, explicit) and not torch.equal(default, typed)


def test_random_init_is_seeded():
    model = _model().eval()
    src, tgt_in, tgt_out = _ids()
    first = model.alignment_scores(src, tgt_in, tgt_out, "layer-sgd", init="random", sgd_steps=0)
    again = model.alignment_scores(src, tgt_in, tgt_out, "layer-sgd", init="random", sgd_steps=0)
    other = model.alignment_scores(src, tgt_in, tgt_out, "layer-sgd", init="random", sgd_steps=0,
                                   seed=5)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert (first[0, :, 3] == 0).all()


def test_base_methods_pass_through_to_the_transformer():
    model = _model().eval()
    src, tgt_in, tgt_out = _ids()
    for method in ("attention", "attention-avg"):
        assert torch.equal(model.alignment_scores(src, tgt_in, tgt_out, method),
                           model.base.alignment_scores(src, tgt_in, tgt_out, method))
    assert torch.equal(model.alignment_scores(src, tgt_in, tgt_out, "attention", layer=1),
                       model.base.alignment_scores(src, tgt_in, tgt_out, "attention", layer=1))
    assert set(model.METHODS) == {"attention", "attention-avg", "layer", "layer-sgd"}


def test_bad_options_are_user_errors():
    from aligner.models.alignment_layer import AlignmentLayerConfig
    model = _model().eval()
    src, tgt_in, tgt_out = _ids()
    with pytest.raises(AlignerError, match="--init"):
        model.alignment_scores(src, tgt_in, tgt_out, "layer-sgd", init="zeros")
    with pytest.raises(AlignerError, match="--sgd-steps"):
        model.alignment_scores(src, tgt_in, tgt_out, "layer-sgd", sgd_steps=-2)
    with pytest.raises(AlignerError, match="--sgd-steps"):
        model.alignment_scores(src, tgt_in, tgt_out, "layer-sgd", sgd_steps=1.5)
    with pytest.raises(AlignerError, match="numbers"):
        model.alignment_scores(src, tgt_in, tgt_out, "layer-sgd", sgd_lr="fast")
    with pytest.raises(AlignerError, match="takes no option"):
        model.alignment_scores(src, tgt_in, tgt_out, "layer", sgd_steps=3)
    with pytest.raises(AlignerError, match="takes no option"):
        model.alignment_scores(src, tgt_in, tgt_out, "layer-sgd", layer=2)
    with pytest.raises(AlignerError, match="takes no option"):
        model.alignment_scores(src, tgt_in, tgt_out, "attention", sgd_steps=3)
    with pytest.raises(AlignerError, match="--layer-keys"):
        AlignmentLayerConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, layer_keys="sum")


def test_state_dict_holds_base_and_layer_and_round_trips():
    model = _model(keys="enc").eval()
    state = model.state_dict()
    assert any(k.startswith("base.") for k in state) and any(k.startswith("layer.") for k in state)
    clone = _model(keys="enc", seed=9).eval()
    clone.load_state_dict(state)
    src, tgt_in, tgt_out = _ids()
    for method in ("layer", "layer-sgd", "attention"):
        assert torch.equal(model.alignment_scores(src, tgt_in, tgt_out, method),
                           clone.alignment_scores(src, tgt_in, tgt_out, method))


def test_load_base_copies_a_trained_transformer_and_freezes_it():
    from aligner.models.transformer import Transformer
    model = _model()
    torch.manual_seed(4)
    base = Transformer(model.config.base_config())
    model.load_base(base.state_dict())
    assert all(torch.equal(base.state_dict()[k], v) for k, v in model.base.state_dict().items())
    assert not any(p.requires_grad for p in model.base.parameters())
    assert model.config.base_config() == base.config


# ---------------------------------------------------------------- it learns alignments

def _reversal_batch(rng, n: int):
    """Dictionary translation with reversed word order: source words w (4..13, distinct within a
    sentence) become target words w + 10 in reverse order. Gold: target i ↔ source L−1−i."""
    from aligner.constants import BOS_ID
    srcs, tgts = [], []
    for _ in range(n):
        words = rng.sample(range(4, 14), rng.randint(3, 6))
        srcs.append(words)
        tgts.append([w + 10 for w in reversed(words)])
    src = torch.full((n, 7), PAD_ID)
    tgt_in = torch.full((n, 7), PAD_ID)
    tgt_out = torch.full((n, 7), PAD_ID)
    for b, (s, t) in enumerate(zip(srcs, tgts)):
        src[b, :len(s) + 1] = torch.tensor(s + [EOS_ID])
        tgt_in[b, :len(t) + 1] = torch.tensor([BOS_ID] + t)
        tgt_out[b, :len(t) + 1] = torch.tensor(t + [EOS_ID])
    return src, tgt_in, tgt_out, [len(s) for s in srcs]


def _fit(model, steps: int, lr: float, rng) -> None:
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(steps):
        src, tgt_in, tgt_out, _ = _reversal_batch(rng, 32)
        loss, n_tokens = model.loss(src, tgt_in, tgt_out)
        optimizer.zero_grad()
        (loss / n_tokens).backward()
        optimizer.step()
    model.eval()


@functools.lru_cache(maxsize=None)
def _reversal_model(seed: int):
    """A base trained on the reversal task, frozen, with the layer trained on top (`seed`:
    initialization and training batches)."""
    import random

    from aligner.models.alignment_layer import AlignmentLayerConfig, AlignmentLayerModel
    from aligner.models.transformer import Transformer
    rng = random.Random(seed)
    torch.manual_seed(seed)
    config = AlignmentLayerConfig(src_vocab_size=24, tgt_vocab_size=24, d_model=32, n_heads=2,
                                  enc_layers=1, dec_layers=2, d_ff=64, dropout=0.0,
                                  layer_dropout=0.0)
    base = Transformer(config.base_config())
    _fit(base, 300, 3e-3, rng)
    model = AlignmentLayerModel(config)
    model.load_base(base.state_dict())
    _fit(model, 150, 1e-2, rng)
    return base, model


def _reversal_accuracy(method: str, seed: int) -> float:
    """Share of the 64 test pairs' target words whose `method` link is the anti-diagonal."""
    import random

    _, model = _reversal_model(seed)
    src, tgt_in, tgt_out, lengths = _reversal_batch(random.Random(1000 + seed), 64)
    with torch.no_grad():
        scores = model.alignment_scores(src, tgt_in, tgt_out, method)
    right = sum(scores[b, i, :n].argmax().item() == n - 1 - i
                for b, n in enumerate(lengths) for i in range(n))
    return right / sum(lengths)


REVERSAL = {method: Bar(f"reversal links found by {method}",
                        functools.partial(_reversal_accuracy, method), above=0.5,
                        margin="measured 0.659-1.000 (layer), 0.679-1.000 (layer-sgd); chance "
                               "is about 0.22")
            for method in ("layer", "layer-sgd")}
BARS += list(REVERSAL.values())


@pytest.mark.quality
@pytest.mark.parametrize("method", ["layer", "layer-sgd"])
def test_layer_learns_the_reversal_alignment_on_a_trained_base(method):
    """A base trained on the reversal task, frozen; the layer on top must find the
    anti-diagonal. The bar (more than half of the links; chance is about 22 %) is set from the
    range measured over seeds and kernel settings, 0.66-1.00 (REVERSAL's margin): one CPU found
    90.6 % where ours found 97 %, so the former bar of 95 % held on some machines only."""
    base, model = _reversal_model(0)
    assert all(torch.equal(base.state_dict()[k], v) for k, v in model.base.state_dict().items())
    REVERSAL[method].check(0)


# ---------------------------------------------------------------- CLI round trip

TINY_CLI = ["--bpe-merges", "20", "--d-model", "16", "--heads", "2", "--encoder-layers", "1",
            "--decoder-layers", "1", "--ff-dim", "32", "--max-tokens", "200", "--warmup", "2",
            "--lr", "3e-3", "--checkpoint-interval", "3", "--max-updates", "3", "-q"]


def _cli(*args, ok: bool = True):
    from click.testing import CliRunner

    from aligner.cli import main
    result = CliRunner().invoke(main, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, (result.output, result.exception)
    return result


def _weights(path):
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


@pytest.fixture
def tiny_corpus(tmp_path):
    from synthetic import monotone_corpus, write_corpus
    sources, targets, golds = monotone_corpus(30, seed=2)
    src, tgt, gold = write_corpus(tmp_path, "train", sources, targets, golds)
    return dict(src=src, tgt=tgt, gold=gold, n=len(sources))


def test_cli_two_stage_training_extract_and_score(tmp_path, tiny_corpus):
    import json

    from aligner.formats import read_pharaoh
    model = tmp_path / "model"
    _cli("train", "-s", tiny_corpus["src"], "-t", tiny_corpus["tgt"], "-o", model,
         "--model", "alignment-layer", "--layer-keys", "word", "--layer-query", "prefix",
         *TINY_CLI)
    base_config = json.loads((model / "base" / "config.json").read_text())
    config = json.loads((model / "config.json").read_text())
    assert base_config["model_kind"] == "transformer"
    assert "layer_keys" not in base_config["models"]["fwd"]
    assert config["model_kind"] == "alignment-layer"
    assert config["models"]["rev"]["layer_keys"] == "word"
    assert config["extra"]["base"] == str(model / "base")
    assert config["prep"] == base_config["prep"]
    # the unguided layer of 2019: no guide, no stage 0 (aligner/training/recipe_guide.py)
    assert config["models"]["fwd"]["layer_query"] == "prefix" and not (model / "guide").exists()
    assert config["data"]["guide"] == "" and config["training"]["guide_weight"] == 0
    for direction in ("fwd", "rev"):   # stage 2 kept the stage-1 weights bit for bit
        base = _weights(model / "base" / direction / "params.best.pt")
        layer = _weights(model / direction / "params.best.pt")
        assert all(torch.equal(layer["base." + k], v) for k, v in base.items())
        assert any(k.startswith("layer.") for k in layer)

    common = ["-s", tiny_corpus["src"], "-t", tiny_corpus["tgt"], "-q"]
    outputs = {}
    for name, extra in {"layer": ["-m", "layer"], "sgd0": ["-m", "layer-sgd", "--sgd-steps", 0],
                        "sgd": [], "random": ["--init", "random", "--sgd-lr", "0.5"],
                        "fwd": ["-m", "layer", "--direction", "fwd"]}.items():
        out = tmp_path / f"{name}.txt"
        _cli("extract", model, *common, "-o", out, *extra)
        outputs[name] = out.read_text()
        assert len(read_pharaoh(str(out))) == tiny_corpus["n"]
    assert outputs["layer"] == outputs["sgd0"]
    result = _cli("score-aer", "-g", tiny_corpus["gold"], "-a", tmp_path / "sgd.txt")
    assert "AER" in result.output

    # stage 2 only, on the base of the first run (--base): same preprocessing and base weights
    again = tmp_path / "again"
    _cli("train", "-s", tiny_corpus["src"], "-t", tiny_corpus["tgt"], "-o", again,
         "--model", "alignment-layer", "--base", model / "base", "--layer-query", "prefix",
         "--valid-src",
         tiny_corpus["src"], "--valid-tgt", tiny_corpus["tgt"], "--valid-gold",
         tiny_corpus["gold"], *TINY_CLI)
    assert not (again / "base").exists() and not (again / "guide").exists()
    header, *rows = (again / "fwd" / "metrics.tsv").read_text().splitlines()
    aer = rows[-1].split("\t")[header.split("\t").index("valid_aer")]
    assert 0.0 <= float(aer) <= 1.0            # validation AER with layer-sgd (the default)
    config = json.loads((again / "config.json").read_text())
    assert config["models"]["fwd"]["layer_keys"] == "add"
    assert (again / "vocab.src.json").read_text() == (model / "vocab.src.json").read_text()
    assert (again / "bpe.src.codes").read_text() == (model / "bpe.src.codes").read_text()
    base = _weights(model / "base" / "fwd" / "params.best.pt")
    layer = _weights(again / "fwd" / "params.best.pt")
    assert all(torch.equal(layer["base." + k], v) for k, v in base.items())


def test_cli_errors_are_one_line(tmp_path, tiny_corpus):
    corpus = ["-s", tiny_corpus["src"], "-t", tiny_corpus["tgt"]]
    result = _cli("train", *corpus, "-o", tmp_path / "a", "--base", tmp_path, ok=False)
    assert result.exit_code == 1 and "only for model kinds trained on a frozen base" in result.output
    result = _cli("train", *corpus, "-o", tmp_path / "b", "--layer-keys", "enc", ok=False)
    assert result.exit_code == 1 and "--layer-keys applies to" in result.output
    result = _cli("train", *corpus, "-o", tmp_path / "c", "--model", "alignment-layer",
                  "--base", tmp_path / "nothing", ok=False)
    assert result.exit_code == 1 and "not a model directory" in result.output
    assert "Traceback" not in result.output


# ---------------------------------------------------------------- the guided layer (2020)

def _guided_model(seed: int = 0, query: str = "target", dropout: float = 0.0):
    from aligner.models.alignment_layer import AlignmentLayerConfig, AlignmentLayerModel
    torch.manual_seed(seed)
    config = AlignmentLayerConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16,
                                  n_heads=2, enc_layers=1, dec_layers=2, d_ff=32,
                                  dropout=0.0, layer_dropout=dropout, layer_query=query,
                                  layer_blocks=1)
    return AlignmentLayerModel(config)


def test_guided_layer_terms_are_its_log_attention_and_its_loss():
    model = _guided_model().eval()
    src, tgt_in, tgt_out = _ids()
    nll, tokens, log_attention = model.training_terms(src, tgt_in, tgt_out, 0.1, posterior=True)
    assert (nll, tokens) == model.loss(src, tgt_in, tgt_out, 0.1)
    assert tokens.item() == 6
    weights = model.alignment_scores(src, tgt_in, tgt_out, "layer")
    allowed = source_mask(src, null=True).expand_as(weights)     # words and EOS ("not aligned")
    assert torch.allclose(log_attention.exp()[allowed], weights[allowed], atol=1e-6)
    assert (log_attention.exp()[~allowed] == 0).all() and log_attention.isfinite().all()
    assert (weights[0, :, 3] > 0).all() and (weights[1, :, 2] > 0).all()   # the EOS columns
    assert model.METHODS[0] == "layer" and _model().METHODS[0] == "layer-sgd"
    assert model.leaves_unaligned_mass("layer") and not model.leaves_unaligned_mass("layer-sgd")
    assert not _model().leaves_unaligned_mass("layer")


def test_unlinked_decoder_tokens_of_a_guided_item_are_guided_to_eos():
    from aligner.training.guidance import unaligned_to_eos
    src, _, tgt_out = _ids()                   # EOS at column 3 (item 0) and 2 (item 1)
    guide = torch.zeros(2, 4, 4)
    guide[0, 0, 2] = guide[0, 2, 0] = 0.5
    guide[0, 2, 1] = 0.5                       # item 0: rows 1 and 3 (EOS) have no link
    completed = unaligned_to_eos(guide, src, tgt_out)
    expected = guide.clone()
    expected[0, 1, 3] = expected[0, 3, 3] = 1.0
    assert torch.equal(completed, expected)    # item 1 has no link at all: no guide
    assert torch.equal(unaligned_to_eos(completed, src, tgt_out), completed)


def test_the_guided_layer_leaves_a_word_unaligned_where_eos_wins():
    """Extraction of the guided layer's ``layer`` links a target word only where its best
    source word is at least as likely as the EOS column ("not aligned")."""
    from aligner.extract.inference import hard_alignment
    model = _guided_model().eval()
    src, tgt_in, tgt_out = _ids()
    scores = torch.zeros(2, 4, 4)                  # rows: target positions; EOS column 3 / 2
    scores[0, 0] = torch.tensor([0.3, 0.1, 0.0, 0.6])     # EOS wins: not aligned
    scores[0, 1] = torch.tensor([0.1, 0.5, 0.2, 0.2])     # word 1 wins
    scores[0, 2] = torch.tensor([0.0, 0.0, 0.4, 0.6])     # EOS wins
    scores[1, 0] = torch.tensor([0.5, 0.1, 0.4, 0.0])     # item 1 (EOS column 2): word 0 wins
    model.alignment_scores = lambda *args, **options: scores
    path = hard_alignment(model, src, tgt_in, tgt_out, "layer")
    assert path.tolist() == [[-1, 1, -1, -1], [0, -1, -1, -1]]


def test_guided_layer_queries_see_the_word_and_the_whole_target_the_2019_layer_does_not():
    src, tgt_in, tgt_out = _ids()
    later = tgt_out.clone()
    later[0, 2] = 7                      # a later target word (position 2) changes ...
    for query, sees in (("target", True), ("prefix", False)):
        model = _guided_model(query=query).eval()
        before = model.alignment_scores(src, tgt_in, tgt_out, "layer")
        after = model.alignment_scores(src, tgt_in, later, "layer")
        # ... the attention of position 0 (before it) only when the queries see the target
        assert (not torch.allclose(before[0, 0], after[0, 0])) == sees
        assert torch.equal(before[1], after[1])


def test_guided_layer_training_reaches_the_target_context_and_not_the_base():
    from aligner.training.loop import guided_loss
    model = _guided_model(dropout=0.1)
    model.train()
    src, tgt_in, tgt_out = _ids()
    guide = torch.zeros(2, 4, 4)
    guide[0, 0, 2] = guide[0, 1, 1] = guide[0, 2, 0] = guide[1, 0, 0] = 1.0
    loss, _ = guided_loss(model, src, tgt_in, tgt_out, 0.0, guide, 1.0)
    # the guide term is taken on the guide with its unlinked rows sent to EOS (item 0: row 3)
    from aligner.training.guidance import guide_cross_entropy, unaligned_to_eos
    torch.manual_seed(5)
    again, _ = guided_loss(model.eval(), src, tgt_in, tgt_out, 0.0, guide, 2.0)
    nll, _, log_attention = model.training_terms(src, tgt_in, tgt_out, 0.0, posterior=True)
    completed = unaligned_to_eos(guide, src, tgt_out)
    assert not torch.equal(completed, guide)
    assert torch.allclose(again, nll + 2.0 * guide_cross_entropy(log_attention, completed))
    model.train()
    loss.backward()
    assert all(p.grad is None for p in model.base.parameters())
    assert model.layer.target_context.blocks[0].attention.q_proj.weight.grad.abs().sum() > 0
    assert model.layer.source_context.blocks[0].feed_forward.fc1.weight.grad.abs().sum() > 0


def _one_word_batch(rng, n: int):
    """`n` pairs whose source words are all one word and target words all another (3-6 words):
    no word tells the positions apart, so only a guide decides the links. (src, tgt_in,
    tgt_out, lengths), source length = target length."""
    from aligner.constants import BOS_ID
    lengths = [rng.randint(3, 6) for _ in range(n)]
    src = torch.full((n, 7), PAD_ID)
    tgt_in = torch.full((n, 7), PAD_ID)
    tgt_out = torch.full((n, 7), PAD_ID)
    for b, length in enumerate(lengths):
        src[b, :length + 1] = torch.tensor([5] * length + [EOS_ID])
        tgt_in[b, :length + 1] = torch.tensor([BOS_ID] + [9] * length)
        tgt_out[b, :length + 1] = torch.tensor([9] * length + [EOS_ID])
    return src, tgt_in, tgt_out, lengths


def _position_guide(lengths, reverse: bool) -> torch.Tensor:
    """fwd guide (B, 7, 7): target word i linked to source word i, or to n-1-i."""
    guide = torch.zeros(len(lengths), 7, 7)
    for b, n in enumerate(lengths):
        for i in range(n):
            guide[b, i, n - 1 - i if reverse else i] = 1.0
    return guide


GUIDED_STEPS = 300
GUIDED_LR = 3e-3


@functools.lru_cache(maxsize=None)
def _guided_accuracy(seed: int, query: str, reverse: bool) -> float:
    """A guided layer (`query`) on a frozen random base, trained GUIDED_STEPS steps by the
    trainer's guided loss (gradient norm clipped at 1, as the trainer does) with the diagonal
    (or `reverse`d) guide on one-word pairs: the share of 64 test pairs' target words whose
    `layer` link is the guide's."""
    import random

    from aligner.extract.inference import hard_alignment
    from aligner.training.loop import guided_loss
    rng = random.Random(seed)
    model = _guided_model(seed, query=query)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=GUIDED_LR)
    model.train()
    for _ in range(GUIDED_STEPS):
        src, tgt_in, tgt_out, lengths = _one_word_batch(rng, 16)
        loss, n_tokens = guided_loss(model, src, tgt_in, tgt_out, 0.0,
                                     _position_guide(lengths, reverse), 1.0)
        optimizer.zero_grad()
        (loss / n_tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)    # as the trainer does
        optimizer.step()
    model.eval()
    src, tgt_in, tgt_out, lengths = _one_word_batch(random.Random(1000 + seed), 64)
    with torch.no_grad():   # as extraction decides: a word EOS wins over is "not aligned"
        path = hard_alignment(model, src, tgt_in, tgt_out, "layer")
    right = sum(path[b, i].item() == (n - 1 - i if reverse else i)
                for b, n in enumerate(lengths) for i in range(n))
    return right / sum(lengths)


GUIDED = {reverse: Bar(f"guided layer's links that are the {name} guide's on one-word pairs",
                       functools.partial(_guided_accuracy, query="target", reverse=reverse),
                       above=0.8, margin=margin)
          for reverse, name, margin in ((False, "diagonal", "measured 1.000"),
                                        (True, "reversed", "measured 1.000"))}
# (the guided bars' margins, also at 2 threads: eval/results/test_margins_alignment_layer.md)
BARS += list(GUIDED.values())


@pytest.mark.quality
@pytest.mark.parametrize("reverse", [False, True], ids=["diagonal", "reversed"])
def test_the_guide_decides_the_guided_layers_links_where_words_cannot(reverse):
    """One-word pairs: the words cannot tell the positions apart, so the diagonal and the
    reversed guide must each be followed (chance is about 0.22)."""
    GUIDED[reverse].check(0)


def test_cli_guided_layer_training_and_its_refusals(tmp_path, tiny_corpus):
    import json

    from aligner.formats import read_pharaoh
    corpus = ["-s", tiny_corpus["src"], "-t", tiny_corpus["tgt"]]
    model = tmp_path / "model"
    _cli("train", *corpus, "-o", model, "--model", "alignment-layer", "--guide",
         tiny_corpus["gold"], *TINY_CLI)
    config = json.loads((model / "config.json").read_text())
    assert config["models"]["fwd"]["layer_query"] == "target"
    assert json.loads((model / "base" / "config.json").read_text())["data"]["guide"] == ""
    layer = _weights(model / "fwd" / "params.best.pt")
    assert any(k.startswith("layer.target_context.") for k in layer)
    out = tmp_path / "out.txt"
    result = _cli("extract", model, *corpus, "-o", out)
    assert len(read_pharaoh(str(out))) == tiny_corpus["n"]
    assert "(layer, both, grow-diag" in result.output     # the guided layer's default method
    # translation by the frozen base, with the guided layer's links of its own output
    translations = tmp_path / "translations.txt"
    _cli("translate", model, "-i", tiny_corpus["src"], "-o", translations, "--print-alignment",
         "--beam", 2, "-q")
    lines = translations.read_text().splitlines()
    assert len(lines) == tiny_corpus["n"] and all(" ||| " in line for line in lines)

    for args, message in (
            (["--layer-query", "target"], "--layer-query applies to"),
            (["--model", "alignment-layer", "--base", model / "base", "--rounds", "2"],
             "self-training"),
            (["--model", "alignment-layer", "--base", model / "base", "--agreement-weight",
              "1"], "agreement training is implemented for")):
        result = _cli("train", *corpus, "-o", tmp_path / "refused", *args, ok=False)
        assert result.exit_code == 1 and message in result.output, result.output
        assert "Traceback" not in result.output
