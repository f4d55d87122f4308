"""The one model contract (aligner/models/base.py): every registered kind is a concrete
AlignmentModel that provides the whole of it, and what differs by kind is read from the
classes (the tables elsewhere agree with the registry)."""
from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from aligner import constants as C
from aligner.links.soft_symmetrize import SOFT_HEURISTICS
from aligner.links.symmetrize import HEURISTICS
from aligner.models import METHODS_BY_KIND, MODELS, build_model
from aligner.models.base import AlignmentModel
from aligner.training.loop import seed_everything

V_SRC, V_TGT = 13, 11
TINY = dict(d_model=16, n_heads=2, enc_layers=1, dec_layers=2, d_ff=32, max_positions=16)


def tiny_model(kind: str, **options) -> AlignmentModel:
    """A tiny model of `kind`: TINY's settings that its config has (the classical aligner
    has no network: max_positions only; its tables are empty, every pair unseen)."""
    seed_everything(0)
    cls = MODELS[kind]
    fields = cls.config_class.__dataclass_fields__
    tiny = {key: value for key, value in TINY.items() if key in fields}
    return cls(cls.config_class(V_SRC, V_TGT, **tiny, **options)).eval()


def tiny_batch():
    """Two pairs, the second shorter on both sides (padding): (src, tgt_in, tgt_out)."""
    pad, bos, eos = C.PAD_ID, C.BOS_ID, C.EOS_ID
    src = torch.tensor([[5, 6, 7, 8, eos], [9, 10, eos, pad, pad]])
    tgt_in = torch.tensor([[bos, 4, 5, 6], [bos, 7, pad, pad]])
    tgt_out = torch.tensor([[4, 5, 6, eos], [7, eos, pad, pad]])
    return src, tgt_in, tgt_out


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_every_kind_is_a_concrete_alignment_model(kind):
    cls = MODELS[kind]
    assert issubclass(cls, AlignmentModel)
    assert not inspect.isabstract(cls), f"{kind} lacks {sorted(cls.__abstractmethods__)}"


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_class_attributes_of_the_contract(kind):
    cls = MODELS[kind]
    assert isinstance(cls.METHODS, tuple) and cls.METHODS
    assert all(isinstance(m, str) and m for m in cls.METHODS)
    assert len(set(cls.METHODS)) == len(cls.METHODS)
    assert METHODS_BY_KIND[kind] == cls.METHODS
    assert dataclasses.is_dataclass(cls.config_class)
    assert callable(cls.config_class.from_dict) and callable(cls.config_class.to_dict)
    assert isinstance(cls.BEST_HEURISTIC, str)
    assert cls.BEST_HEURISTIC in HEURISTICS or cls.BEST_HEURISTIC in SOFT_HEURISTICS
    assert cls.TRANSLATE_ALIGNMENT_METHOD is None or cls.TRANSLATE_ALIGNMENT_METHOD in cls.METHODS
    assert cls.BASE_KIND is None or cls.BASE_KIND in MODELS
    assert isinstance(cls.TRAINS_POSTERIOR, bool)
    base, own = cls.split_options({"d_model": 16})
    assert isinstance(base, dict) and isinstance(own, dict)
    if cls.BASE_KIND is None:
        assert (base, own) == ({}, {"d_model": 16})


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_training_terms_give_the_loss_and_a_posterior_where_declared(kind):
    """TRAINS_POSTERIOR kinds: training_terms' NLL is the loss and its posterior is the
    alignment distribution that ``hmm-posterior`` (the direct HMMs) or ``layer`` (the
    alignment layer's attention) extracts (rows of real target words sum to 1); the other
    kinds refuse training_terms."""
    model = tiny_model(kind)
    src, tgt_in, tgt_out = tiny_batch()
    if not MODELS[kind].TRAINS_POSTERIOR:
        with pytest.raises(NotImplementedError, match="TRAINS_POSTERIOR is False"):
            model.training_terms(src, tgt_in, tgt_out, posterior=True)
        return
    nll, tokens, log_posterior = model.training_terms(src, tgt_in, tgt_out, posterior=True)
    loss, loss_tokens = model.loss(src, tgt_in, tgt_out)
    assert torch.allclose(nll, loss) and int(tokens) == int(loss_tokens)
    method = "layer" if kind == "alignment-layer" else "hmm-posterior"
    expected = model.alignment_scores(src, tgt_in, tgt_out, method)
    real = tgt_out.ne(0)
    assert torch.allclose(log_posterior.exp()[real], expected[real], atol=1e-5)
    assert model.training_terms(src, tgt_in, tgt_out)[2] is None


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_loss_and_every_method_on_a_tiny_batch(kind):
    model = tiny_model(kind)
    cls = MODELS[kind]
    assert isinstance(model.config, cls.config_class)
    assert model.config.max_positions == TINY["max_positions"]
    rebuilt = build_model(kind, model.config.to_dict())       # the registry's way, as on load
    assert type(rebuilt) is cls and rebuilt.config == model.config
    src, tgt_in, tgt_out = tiny_batch()
    batch, rows, columns = src.size(0), tgt_out.size(1), src.size(1)

    model.train()
    loss, n_tokens = model.loss(src, tgt_in, tgt_out)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert int(n_tokens) == int(tgt_out.ne(C.PAD_ID).sum())
    model.eval()
    with torch.no_grad():
        for method in cls.METHODS:
            scores = model.alignment_scores(src, tgt_in, tgt_out, method)
            assert scores.shape == (batch, rows, columns), method
            assert not torch.isnan(scores).any(), method
            path = model.alignment_path(src, tgt_in, tgt_out, method)
            assert path is None or (path.shape == (batch, rows)
                                    and not path.dtype.is_floating_point), method


def teacher_forced_log_likelihood(model: AlignmentModel, src, tgt_in, tgt_out) -> float:
    """Σ over the batch of decode_step's log p of each reference word, fed the reference
    prefix (padded positions skipped): −loss for a kind that decodes with its own model."""
    total, state = torch.zeros(()), model.init_decode_state(src)
    with torch.no_grad():
        for i in range(tgt_in.size(1)):
            log_p, state = model.decode_step(state, tgt_in[:, i])
            gold = log_p.gather(1, tgt_out[:, i:i + 1]).squeeze(1)
            total += gold.masked_fill(tgt_out[:, i].eq(C.PAD_ID), 0.0).sum()
    return float(total)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_decode_contract(kind):
    """init_decode_state / decode_step / reorder_decode_state: float32 log-probabilities over
    the target vocabulary, one row per hypothesis; the given state is left as it is; rows are
    selected (and repeated) by reorder; teacher-forced steps give the training loss."""
    model = tiny_model(kind)
    src, tgt_in, tgt_out = tiny_batch()
    if not model.TRANSLATES:   # one line for align translate, not a traceback
        from aligner.utils import AlignerError

        with pytest.raises(AlignerError, match="does not translate"):
            model.init_decode_state(src)
        return
    with torch.no_grad():
        state = model.init_decode_state(src)
        assert isinstance(state, dict)
        log_p, next_state = model.decode_step(state, tgt_in[:, 0])
        assert log_p.shape == (src.size(0), V_TGT) and log_p.dtype == torch.float32
        torch.testing.assert_close(torch.logsumexp(log_p, -1), torch.zeros(src.size(0)))
        again, _ = model.decode_step(state, tgt_in[:, 0])       # state not changed in place
        assert torch.equal(again, log_p)
        # row 1 kept twice, row 0 dropped: the steps of the kept rows are those of row 1
        rows = torch.tensor([1, 1])
        picked, _ = model.decode_step(model.reorder_decode_state(next_state, rows), tgt_in[rows, 1])
        alone, _ = model.decode_step(next_state, tgt_in[:, 1])
        torch.testing.assert_close(picked, alone[rows])
        if model.BASE_KIND is None:       # a two-stage kind translates with its base instead
            loss, _ = model.loss(src, tgt_in, tgt_out)
            assert teacher_forced_log_likelihood(model, src, tgt_in, tgt_out) == \
                pytest.approx(-float(loss), abs=1e-4)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_optional_hooks(kind):
    model = tiny_model(kind)
    state = model.extra_state()
    assert isinstance(state, dict)
    model.load_extra_state(state)
    if model.BASE_KIND is None:
        with pytest.raises(NotImplementedError):
            model.load_base({})
    else:
        base = MODELS[model.BASE_KIND](MODELS[model.BASE_KIND].config_class(V_SRC, V_TGT, **TINY))
        model.load_base(base.state_dict())


def test_a_kind_missing_part_of_the_contract_cannot_be_built():
    class NoScores(AlignmentModel):
        METHODS = ("x",)
        config_class = MODELS["transformer"].config_class

        def loss(self, src, tgt_in, tgt_out, label_smoothing=0.0):
            raise NotImplementedError

    with pytest.raises(TypeError, match="alignment_scores"):
        NoScores()


def test_tables_outside_the_registry_agree_with_it():
    from aligner.cli.train import KNOWN_KINDS
    from aligner.translate import default_alignment_method

    assert sorted(KNOWN_KINDS.split(", ")) == sorted(MODELS)
    # the defaults of align translate --print-alignment, as they were before the registry
    assert {kind: default_alignment_method(tiny_model(kind)) for kind in MODELS} == {
        "transformer": "attention", "hmm0": "hmm-posterior", "hmm1": "hmm-viterbi",
        "alignment-layer": "layer-sgd", "classical": "hmm-posterior"}
    # the guided alignment layer's own attention
    assert default_alignment_method(tiny_model("alignment-layer", layer_query="target")) == "layer"
