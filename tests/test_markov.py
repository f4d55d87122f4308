"""The Markov decoder (``markov_order`` k): banded, transparent self-attention for every kind.

The leak test: with order k, the output at decoder position q reads only the input tokens at
positions q-k+1..q, through *every* layer. Changing any earlier token must leave it unchanged,
while changing the oldest token inside the window must change it (so the test can fail).
An ordinary causal decoder, and a banded decoder *without* static keys/values, would leak.
"""
from __future__ import annotations

import pytest
import torch

from aligner.constants import BOS_ID, EOS_ID, PAD_ID
from aligner.models import build_model
from aligner.models.transformer import (MultiHeadAttention, TransformerConfig,
                                        decoder_self_attention, self_attention_mask)
from aligner.utils import AlignerError

V_SRC, V_TGT, STEPS = 15, 17, 9
KINDS = ("transformer", "hmm0", "hmm1", "alignment-layer")


def tiny(kind: str, markov_order: int, seed: int = 0):
    """A tiny model of `kind` in eval mode (3 decoder layers, so leaks could travel)."""
    torch.manual_seed(seed)
    config = dict(src_vocab_size=V_SRC, tgt_vocab_size=V_TGT, d_model=16, n_heads=2,
                  enc_layers=1, dec_layers=3, d_ff=32, dropout=0.0, max_positions=32,
                  markov_order=markov_order)
    return build_model(kind, config).eval()


def position_outputs(model, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    """Everything a model computes at each decoder position, flattened: (B, I+1, features).

    transformer / alignment layer: next-word logits (and the layer's attention); hmm0/hmm1:
    alignment distribution log α and the lexicon query W6·s.
    """
    if hasattr(model, "layer_forward"):          # alignment-layer: the layer's own outputs
        logits, attention = model.layer_forward(src, tgt_in)
        return torch.cat([logits, attention], dim=-1)
    if hasattr(model, "output_layer"):           # direct HMM
        log_alpha, _, target_hidden = model.decode(src, tgt_in)
        log_alpha = log_alpha.reshape(*log_alpha.shape[:2], -1)
        return torch.cat([log_alpha.masked_fill(log_alpha.isinf(), -1e4), target_hidden], -1)
    return model(src, tgt_in)


def random_batch(seed: int):
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V_SRC, (2, 6), generator=generator)
    src[:, -1] = EOS_ID
    tgt_in = torch.randint(4, V_TGT, (2, STEPS), generator=generator)
    tgt_in[:, 0] = BOS_ID
    return src, tgt_in


def replace_before(tgt_in: torch.Tensor, cut: int, seed: int) -> torch.Tensor:
    """A copy whose tokens at positions < cut are all different (BOS included)."""
    changed = tgt_in.clone()
    generator = torch.Generator().manual_seed(seed)
    for position in range(cut):
        new = torch.randint(4, V_TGT, (tgt_in.size(0),), generator=generator)
        same = new.eq(tgt_in[:, position])
        changed[:, position] = torch.where(same, (new - 4 + 1) % (V_TGT - 4) + 4, new)
    assert changed[:, :cut].ne(tgt_in[:, :cut]).all()
    return changed


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("order", [1, 2, 4])
def test_output_at_q_ignores_tokens_before_its_window(kind, order):
    model = tiny(kind, order)
    src, tgt_in = random_batch(seed=order)
    before = position_outputs(model, src, tgt_in)
    for cut in range(1, STEPS - order + 1):
        changed = replace_before(tgt_in, cut, seed=cut)
        after = position_outputs(model, src, changed)
        first_blind = cut + order - 1          # first position whose window starts at `cut`
        assert torch.allclose(after[:, first_blind:], before[:, first_blind:], atol=1e-5), \
            f"position >= {first_blind} saw a token before position {cut} (order {order})"
        # the position whose window still holds token cut-1 must notice the change
        assert not torch.allclose(after[:, first_blind - 1], before[:, first_blind - 1],
                                  atol=1e-4)


@pytest.mark.parametrize("kind", ["transformer", "hmm0"])
def test_an_ordinary_decoder_leaks_so_the_test_above_can_fail(kind):
    model = tiny(kind, 0)
    src, tgt_in = random_batch(seed=1)
    changed = replace_before(tgt_in, 1, seed=3)      # only BOS changes
    before, after = position_outputs(model, src, tgt_in), position_outputs(model, src, changed)
    assert not torch.allclose(after[:, -1], before[:, -1], atol=1e-4)


def test_banded_attention_over_hidden_states_would_leak_through_layers():
    """Why keys/values must be static: a band over each layer's own states reaches k per layer."""
    torch.manual_seed(0)
    order, d_model, steps = 2, 8, 6
    attentions = [MultiHeadAttention(d_model, 2, 0.0) for _ in range(3)]
    norm = torch.nn.LayerNorm(d_model)
    x0 = torch.randn(1, steps, d_model)
    mask = self_attention_mask(steps, steps, order, x0.device)

    def banded_over_states(x):
        for attention in attentions:
            normed = norm(x)
            x = x + attention(normed, normed, attn_mask=mask)[0]
        return x

    def transparent(x):
        static = x
        for attention in attentions:
            x = x + decoder_self_attention(attention, norm, x, None, static, order)
        return x

    changed = x0.clone()
    changed[0, 1] = torch.randn(d_model)   # order 2: position 3 sees 2..3, yet a band over
    # each layer's own states reaches one position further back per layer
    assert not torch.allclose(banded_over_states(changed)[0, 3], banded_over_states(x0)[0, 3])
    assert torch.allclose(transparent(changed)[0, 3:], transparent(x0)[0, 3:])
    assert not torch.allclose(transparent(changed)[0, 2], transparent(x0)[0, 2])


def test_self_attention_mask_by_hand():
    allowed = ~self_attention_mask(4, 4, 2, torch.device("cpu"))
    assert allowed.int().tolist() == [[1, 0, 0, 0],
                                      [1, 1, 0, 0],
                                      [0, 1, 1, 0],
                                      [0, 0, 1, 1]]
    # no Markov restriction: plain causal
    assert (~self_attention_mask(3, 3, 0, torch.device("cpu"))).int().tolist() == [
        [1, 0, 0], [1, 1, 0], [1, 1, 1]]
    # incremental decoding: one query, the last of 5 keys; order 3 sees the last 3
    assert (~self_attention_mask(1, 5, 3, torch.device("cpu"))).int().tolist() == [
        [0, 0, 1, 1, 1]]
    assert (~self_attention_mask(2, 5, 0, torch.device("cpu"))).int().tolist() == [
        [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


@pytest.mark.parametrize("kind", KINDS)
def test_markov_models_train_and_padding_gives_finite_losses(kind):
    """Order 1 with right padding: padded queries see only padded keys; nothing is NaN."""
    model = tiny(kind, 1).train()
    src = torch.tensor([[5, 6, EOS_ID, PAD_ID], [7, 8, 9, EOS_ID]])
    tgt_in = torch.tensor([[BOS_ID, 5, PAD_ID, PAD_ID, PAD_ID], [BOS_ID, 6, 7, 8, 9]])
    tgt_out = torch.tensor([[5, EOS_ID, PAD_ID, PAD_ID, PAD_ID], [6, 7, 8, 9, EOS_ID]])
    if kind == "alignment-layer":  # only the layer trains; its base is frozen
        parameters = list(model.layer.parameters())
    else:
        parameters = list(model.parameters())
    loss, n_tokens = model.loss(src, tgt_in, tgt_out, label_smoothing=0.1)
    loss.backward()
    assert torch.isfinite(loss) and int(n_tokens) == 7
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in parameters)
    # padding changes nothing: sentence 0 alone, unpadded, has the same loss
    model.eval()
    unpadded, _ = model.loss(src[:1, :3], tgt_in[:1, :2], tgt_out[:1, :2])
    padded, _ = model.loss(src[:1], tgt_in[:1], tgt_out[:1])
    assert torch.allclose(unpadded, padded, atol=1e-5)


def test_markov_order_is_saved_in_the_config_and_validated():
    config = TransformerConfig(src_vocab_size=8, tgt_vocab_size=8, markov_order=3)
    assert config.to_dict()["markov_order"] == 3
    assert TransformerConfig.from_dict(config.to_dict()).markov_order == 3
    # configs written before the option existed load as ordinary decoders
    old = {k: v for k, v in config.to_dict().items() if k != "markov_order"}
    assert TransformerConfig.from_dict(old).markov_order == 0
    with pytest.raises(AlignerError, match="markov_order"):
        TransformerConfig(src_vocab_size=8, tgt_vocab_size=8, markov_order=-1)
    with pytest.raises(ValueError, match="static embeddings"):
        attention = MultiHeadAttention(8, 2, 0.0)
        decoder_self_attention(attention, torch.nn.LayerNorm(8), torch.zeros(1, 2, 8), None,
                               None, markov_order=2)


def test_align_train_markov_order_reaches_the_saved_model_and_translate(tmp_path):
    """`align train --markov-order 2` stores the order in config.json for both directions;
    the loaded models are Markov decoders and `align translate` uses them."""
    import json

    from click.testing import CliRunner

    from aligner.cli import main
    from aligner.model_dir import LoadedModelDir

    (tmp_path / "a.src").write_text("a b c\nb c\nc a b d\n", encoding="utf-8")
    (tmp_path / "a.tgt").write_text("x y z\ny z\nz x y w\n", encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(main, [
        "train", "-s", str(tmp_path / "a.src"), "-t", str(tmp_path / "a.tgt"), "-o",
        str(tmp_path / "m"), "--model", "transformer", "--bpe-merges", "0", "--d-model", "16", "--heads", "2",
        "--encoder-layers", "1", "--decoder-layers", "2", "--ff-dim", "16", "--max-updates",
        "2", "--max-epochs", "0", "--checkpoint-interval", "2", "--markov-order", "2",
        "--device", "cpu", "-q"])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "m" / "config.json").read_text(encoding="utf-8"))
    assert [config["models"][d]["markov_order"] for d in ("fwd", "rev")] == [2, 2]
    loaded = LoadedModelDir.load(str(tmp_path / "m"), ("fwd",))
    assert loaded.models["fwd"].decoder.markov_order == 2
    result = runner.invoke(main, ["translate", str(tmp_path / "m"), "-i",
                                  str(tmp_path / "a.src"), "--beam", "2", "-q"])
    assert result.exit_code == 0 and result.stdout.count("\n") == 3, result.output
    result = runner.invoke(main, ["train", "-s", str(tmp_path / "a.src"), "-t",
                                  str(tmp_path / "a.tgt"), "-o", str(tmp_path / "m2"),
                                  "--markov-order", "-1"])
    assert result.exit_code == 2 and "--markov-order" in result.output
