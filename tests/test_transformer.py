"""The transformer building blocks: shapes, masks, causality, the two attention paths, loss."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from aligner.constants import BOS_ID, EOS_ID, PAD_ID
from aligner.models import METHODS_BY_KIND, MODELS, build_model
from aligner.models.transformer import (Embedding, MultiHeadAttention, Transformer,
                                        TransformerConfig, sinusoidal_positions)
from aligner.utils import AlignerError


def tiny_config(**overrides) -> TransformerConfig:
    values = dict(src_vocab_size=20, tgt_vocab_size=24, d_model=16, n_heads=2, enc_layers=2,
                  dec_layers=3, d_ff=32, dropout=0.0, max_positions=64)
    values.update(overrides)
    return TransformerConfig(**values)


def tiny_model(**overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config(**overrides)).eval()


def batch():
    """Two pairs: source lengths 3 and 1 (+EOS), target lengths 2 and 4 (+BOS/EOS)."""
    src = torch.tensor([[5, 6, 7, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID]])
    tgt_in = torch.tensor([[BOS_ID, 9, 10, PAD_ID, PAD_ID], [BOS_ID, 11, 12, 13, 14]])
    tgt_out = torch.tensor([[9, 10, EOS_ID, PAD_ID, PAD_ID], [11, 12, 13, 14, EOS_ID]])
    return src, tgt_in, tgt_out


def test_sinusoidal_table_by_hand():
    table = sinusoidal_positions(5, 4)
    assert table.shape == (5, 4)
    assert torch.allclose(table[0], torch.tensor([0.0, 1.0, 0.0, 1.0]))
    # position 3, channel pair 1 has rate 10000^(-2/4) = 0.01
    assert table[3, 2].item() == pytest.approx(math.sin(3 * 0.01), abs=1e-6)
    assert table[3, 3].item() == pytest.approx(math.cos(3 * 0.01), abs=1e-6)


def test_embedding_word_has_no_positions_and_forward_adds_them():
    torch.manual_seed(0)
    embed = Embedding(10, 8, max_positions=16, dropout=0.0)
    ids = torch.tensor([[4, 4, PAD_ID]])
    words = embed.word(ids)
    assert words.shape == (1, 3, 8)
    assert torch.equal(words[0, 0], words[0, 1])          # same token, same word embedding
    assert torch.equal(words[0, 2], torch.zeros(8))       # PAD embeds to zero
    assert torch.allclose(embed.word(ids), embed.token(ids) * math.sqrt(8))
    assert torch.allclose(embed(ids), words + sinusoidal_positions(16, 8)[:3])
    with pytest.raises(AlignerError, match="max_positions"):
        embed(torch.ones(1, 17, dtype=torch.long))


def test_attention_weights_are_distributions_over_unpadded_keys():
    torch.manual_seed(0)
    attention = MultiHeadAttention(8, 2, dropout=0.0)
    query, memory = torch.randn(2, 3, 8), torch.randn(2, 4, 8)
    pad = torch.tensor([[False, False, False, False], [False, False, True, True]])
    out, weights = attention(query, memory, key_padding_mask=pad, need_weights=True)
    assert out.shape == (2, 3, 8) and weights.shape == (2, 2, 3, 4)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 2, 3))
    assert torch.all(weights[1, :, :, 2:] == 0)
    fast, none = attention(query, memory, key_padding_mask=pad, need_weights=False)
    assert none is None
    assert torch.allclose(fast, out, atol=1e-6)           # SDPA path == explicit softmax path


@pytest.mark.parametrize("causal", [False, True])
def test_bf16_cpu_attention_with_gradients_equals_the_float32_product(causal):
    """Under CPU bf16 autocast with gradients the attention runs as explicit products
    (torch's bf16 flash attention is several times slower there): its output and gradients
    match float32 attention within bfloat16's rounding, padded keys get no weight, and
    without gradients (extraction) SDPA still runs."""
    from aligner.models import transformer
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 2, dropout=0.0)
    query, memory = torch.randn(3, 5, 16), torch.randn(3, 5, 16)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[1, 3:] = True
    out32, _ = attention(query, memory, key_padding_mask=pad, causal=causal)
    grads32 = torch.autograd.grad(out32.square().sum(), list(attention.parameters()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q = attention.q_proj(query)
        assert q.dtype == torch.bfloat16 and transformer._explicit_attention(q)
        out16, unasked = attention(query, memory, key_padding_mask=pad, causal=causal)
        assert unasked is None                  # weights only when asked for, on any path
        with torch.no_grad():
            assert not transformer._explicit_attention(attention.q_proj(query))
    grads16 = torch.autograd.grad(out16.float().square().sum(), list(attention.parameters()))
    assert torch.allclose(out16.float(), out32, atol=0.05, rtol=0.02)
    scale = max(g.abs().max().item() for g in grads32)       # (the key bias's is ~0 exactly)
    for got, want in zip(grads16, grads32):
        assert torch.allclose(got, want, atol=0.03 * scale, rtol=0.03)
    # a change to a padded key's memory changes nothing
    moved = memory.clone()
    moved[1, 4] += 10.0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_moved, _ = attention(query, moved, key_padding_mask=pad, causal=causal)
    assert torch.equal(out_moved[1], out16[1])


def test_causal_mask_by_hand():
    mask = MultiHeadAttention.build_mask(torch.tensor([[False, False, True]]), 3, 3, True,
                                         torch.device("cpu"))
    expected = torch.tensor([[False, True, True], [False, False, True], [False, False, True]])
    assert torch.equal(mask[0, 0], expected)


def test_shapes_of_encode_decode_logits():
    model = tiny_model()
    src, tgt_in, _ = batch()
    memory = model.encode(src)
    assert memory.shape == (2, 4, 16)
    assert model.embed_source_words(src).shape == (2, 4, 16)
    states, attention = model.decode(tgt_in, memory, src, need_attention=True)
    assert states.shape == (2, 5, 16)
    assert len(attention) == 3 and all(a.shape == (2, 2, 5, 4) for a in attention)
    assert model.logits(states).shape == (2, 5, 24)
    states_fast, none = model.decode(tgt_in, memory, src)
    assert none is None
    assert torch.allclose(states, states_fast, atol=1e-5)


def test_decoder_is_causal():
    """Changing target token k changes no decoder output at positions < k."""
    model = tiny_model()
    src, tgt_in, _ = batch()
    before = model(src, tgt_in)
    changed = tgt_in.clone()
    changed[1, 3] = 5
    after = model(src, changed)
    assert torch.allclose(before[1, :3], after[1, :3], atol=1e-6)
    assert not torch.allclose(before[1, 3], after[1, 3], atol=1e-4)
    assert torch.allclose(before[0], after[0], atol=1e-6)


def test_padding_does_not_change_results():
    """A pair scored alone equals the same pair inside a padded batch."""
    model = tiny_model()
    src, tgt_in, tgt_out = batch()
    alone = model.alignment_scores(src[:1, :4], tgt_in[:1, :3], tgt_out[:1, :3], "attention-avg")
    batched = model.alignment_scores(src, tgt_in, tgt_out, "attention-avg")
    assert torch.allclose(alone[0], batched[0, :3, :4], atol=1e-5)
    alone_logits = model(src[1:, :2], tgt_in[1:])
    assert torch.allclose(alone_logits[0], model(src, tgt_in)[1], atol=1e-5)


def test_loss_is_summed_smoothed_cross_entropy_over_non_pad_tokens():
    model = tiny_model()
    src, tgt_in, tgt_out = batch()
    loss, n_tokens = model.loss(src, tgt_in, tgt_out, label_smoothing=0.1)
    assert n_tokens.item() == 3 + 5
    log_probs = torch.log_softmax(model(src, tgt_in), dim=-1)
    expected = 0.0
    for b in range(2):
        for i in range(5):
            gold = tgt_out[b, i].item()
            if gold == PAD_ID:
                continue
            nll = -log_probs[b, i, gold]
            smooth = -log_probs[b, i].mean()
            expected += 0.9 * nll + 0.1 * smooth
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    plain, _ = model.loss(src, tgt_in, tgt_out)
    assert plain.item() == pytest.approx(
        F.cross_entropy(model(src, tgt_in).reshape(-1, 24), tgt_out.reshape(-1),
                        ignore_index=PAD_ID, reduction="sum").item(), rel=1e-6)


def test_alignment_scores_methods_and_layers():
    model = tiny_model()
    src, tgt_in, tgt_out = batch()
    _, attention = model.decode(tgt_in, model.encode(src), src, need_attention=True)
    default = model.alignment_scores(src, tgt_in, tgt_out, "attention")
    assert default.shape == (2, 5, 4)
    assert torch.allclose(default, attention[1].mean(1))  # penultimate of 3 layers = layer 2
    layer3 = model.alignment_scores(src, tgt_in, tgt_out, "attention", layer=3)
    assert torch.allclose(layer3, attention[2].mean(1))
    average = model.alignment_scores(src, tgt_in, tgt_out, "attention-avg")
    assert torch.allclose(average, sum(a.mean(1) for a in attention) / 3, atol=1e-6)
    assert torch.allclose(average.sum(-1), torch.ones(2, 5), atol=1e-5)
    with pytest.raises(AlignerError, match="between 1 and 3"):
        model.alignment_scores(src, tgt_in, tgt_out, "attention", layer=4)
    with pytest.raises(AlignerError, match="unknown method"):
        model.alignment_scores(src, tgt_in, tgt_out, "hmm-viterbi")


def test_single_decoder_layer_default_is_layer_one():
    model = tiny_model(dec_layers=1)
    assert model.default_layer() == 1


def test_tied_and_untied_output_projection():
    tied = tiny_model()
    assert tied.output.weight is tied.decoder.embed.token.weight
    untied = tiny_model(tie_embeddings=False)
    assert untied.output.weight is not untied.decoder.embed.token.weight


def test_registry_builds_from_config_dict():
    assert "transformer" in MODELS
    assert METHODS_BY_KIND["transformer"] == ("attention", "attention-avg")
    config = tiny_config().to_dict()
    model = build_model("transformer", config)
    assert isinstance(model, Transformer) and model.config == tiny_config()
    with pytest.raises(AlignerError, match="unknown TransformerConfig keys: d_modell"):
        build_model("transformer", {**config, "d_modell": 3})
    with pytest.raises(AlignerError, match="unknown model kind"):
        build_model("lstm", config)
    with pytest.raises(AlignerError, match="divisible"):
        tiny_config(n_heads=3)
