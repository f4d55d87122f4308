"""Agreement training (aligner/training/agreement.py, align train --agreement-weight)."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from aligner.training.agreement import AgreementPair, disagreement, reverse_batch, reverse_guide
from aligner.data import make_batch
from aligner.formats import read_pharaoh
from aligner.training.guidance import guide_cross_entropy, guide_matrix
from aligner.models import hmm_algorithms as hmm
from aligner.models.direct_hmm import FirstOrderHMM, ZeroOrderHMM
from conftest import restored_aligner_logger
from quality import Bar
from synthetic import monotone_corpus, write_corpus
from test_direct_hmm import LONG_PAIRS, _model
from test_guide import run, spy_training_terms

SOURCES = [[4, 5, 6, 7, 8, 9], [9, 4], [8]]
TARGETS = [[7, 8, 9, 10, 4], [5, 6, 10, 4, 5, 6, 7], [9]]


def _tensors(sources, targets, direction):
    batch = make_batch(sources, targets, direction)
    return batch.src, batch.tgt_in, batch.tgt_out


def _pair(cls, weight, seed=0, **changes):
    """fwd and rev tiny models (different seeds: they start out disagreeing)."""
    return AgreementPair(_model(cls, seed=2 * seed, **changes),
                         _model(cls, seed=2 * seed + 1, **changes), weight)


def test_reverse_batch_is_the_batch_make_batch_builds_for_rev():
    fwd = make_batch(SOURCES, TARGETS, "fwd")
    rev = make_batch(SOURCES, TARGETS, "rev")
    for built, expected in zip(reverse_batch(fwd.src, fwd.tgt_out),
                               (rev.src, rev.tgt_in, rev.tgt_out)):
        assert torch.equal(built, expected)


def test_reverse_guide_is_the_guide_matrix_of_rev():
    links = [np.array([[0, 0], [1, 0], [2, 1], [5, 4]]), np.zeros((0, 2), dtype=np.int64),
             np.array([[0, 0]])]
    fwd = guide_matrix(links, "fwd", 8, 7)
    assert torch.equal(reverse_guide(fwd), guide_matrix(links, "rev", 7, 8))


def test_disagreement_counts_squared_differences_of_real_words_only():
    # one pair: 2 source words + EOS, 1 target word + EOS (+ one padded target position)
    src = torch.tensor([[5, 6, 2]])
    tgt_out = torch.tensor([[7, 2, 0]])
    gamma_fwd = torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [9.0, 9.0, 9.0]]])
    gamma_rev = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.5, 0.5], [7.0, 7.0, 7.0]]])
    # real cells: (i=0, j=0): 0.5 vs rev[0, 0] = 1.0; (i=0, j=1): 0.25 vs rev[1, 0] = 0.0
    expected = (0.5 - 1.0) ** 2 + (0.25 - 0.0) ** 2
    assert disagreement(gamma_fwd, gamma_rev, src, tgt_out).item() == pytest.approx(expected)
    assert disagreement(gamma_fwd, gamma_fwd.transpose(1, 2)[:, :3, :3], src,
                        tgt_out).item() == 0.0


@pytest.mark.parametrize("cls", [ZeroOrderHMM, FirstOrderHMM])
def test_pair_loss_is_both_directions_loss_plus_weighted_disagreement(cls):
    fwd_batch = _tensors(SOURCES, TARGETS, "fwd")
    rev_batch = _tensors(SOURCES, TARGETS, "rev")
    pair = _pair(cls, 0.7)
    fwd_loss, fwd_tokens = pair.fwd.loss(*fwd_batch)
    rev_loss, rev_tokens = pair.rev.loss(*rev_batch)
    gamma_fwd = pair.fwd.alignment_scores(*fwd_batch, "hmm-posterior")
    gamma_rev = pair.rev.alignment_scores(*rev_batch, "hmm-posterior")
    expected = fwd_loss + rev_loss + 0.7 * disagreement(gamma_fwd, gamma_rev, fwd_batch[0],
                                                        fwd_batch[2])
    loss, tokens = pair.loss(*fwd_batch)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert int(tokens) == int(fwd_tokens + rev_tokens) == sum(map(len, SOURCES + TARGETS)) + 6
    # a weight-0 pair is the two losses and nothing else
    unweighted, _ = AgreementPair(pair.fwd, pair.rev, 0.0).loss(*fwd_batch)
    assert unweighted.item() == pytest.approx((fwd_loss + rev_loss).item(), rel=1e-6)


def test_pair_builds_its_terms_from_the_contracts_training_terms_only(monkeypatch):
    """Each direction is asked for nothing but the contract's training_terms (with the
    posterior); the pair adds λ·disagreement and the guide term of both directions itself."""
    pair = _pair(ZeroOrderHMM, 0.7)
    fwd_batch, rev_batch = _tensors(SOURCES, TARGETS, "fwd"), _tensors(SOURCES, TARGETS, "rev")
    links = [np.array([[min(i, len(s) - 1), i] for i in range(len(t))])
             for s, t in zip(SOURCES, TARGETS)]
    guide = guide_matrix(links, "fwd", fwd_batch[2].size(1), fwd_batch[0].size(1))
    nll_fwd, _, log_fwd = pair.fwd.training_terms(*fwd_batch, 0.1, posterior=True)
    nll_rev, _, log_rev = pair.rev.training_terms(*rev_batch, 0.1, posterior=True)
    calls = []
    for direction in ("fwd", "rev"):
        model = getattr(pair, direction)
        monkeypatch.setattr(model, "training_terms", spy_training_terms(model, direction, calls))
    terms = pair.terms(*fwd_batch, 0.1, guide=guide, guide_weight=0.5)
    assert calls == [("fwd", True), ("rev", True)]
    assert torch.equal(terms["nll_fwd"], nll_fwd) and torch.equal(terms["nll_rev"], nll_rev)
    assert torch.equal(terms["agreement"], 0.7 * disagreement(log_fwd.exp(), log_rev.exp(),
                                                              fwd_batch[0], fwd_batch[2]))
    reversed_guide = guide_matrix(links, "rev", rev_batch[2].size(1), rev_batch[0].size(1))
    expected = 0.5 * (guide_cross_entropy(log_fwd, guide)
                      + guide_cross_entropy(log_rev, reversed_guide))
    assert terms["guide"].item() == pytest.approx(expected.item(), rel=1e-6)


def test_disagreement_of_first_order_posteriors_passes_gradcheck():
    """d D(γ_f(E_f), γ_r(E_r)) / d E by double backward through both forward recursions ==
    finite differences (float64, padding and masked states)."""
    generator = torch.Generator().manual_seed(5)
    src = torch.tensor([[5, 6, 7, 2], [5, 6, 2, 0]])
    tgt_out = torch.tensor([[8, 9, 2], [8, 2, 0]])
    src_mask, tgt_mask = src.ne(0), tgt_out.ne(0)
    lengths_f, lengths_r = tgt_mask.sum(1), src_mask.sum(1)

    def random_hmm(steps, states):
        initial = torch.log_softmax(torch.randn(2, states, generator=generator,
                                                dtype=torch.float64), -1)
        transition = torch.log_softmax(torch.randn(2, steps, states, states,
                                                   generator=generator, dtype=torch.float64), -1)
        return initial, transition

    initial_f, transition_f = random_hmm(3, 4)
    initial_r, transition_r = random_hmm(4, 3)

    def objective(emission_f, emission_r):
        gamma_f = hmm.posteriors(hmm.forward_log_z(emission_f, initial_f, transition_f,
                                                   lengths_f, src_mask), emission_f, True)
        gamma_r = hmm.posteriors(hmm.forward_log_z(emission_r, initial_r, transition_r,
                                                   lengths_r, tgt_mask), emission_r, True)
        return disagreement(gamma_f, gamma_r, src, tgt_out)

    emission_f = torch.randn(2, 3, 4, generator=generator, dtype=torch.float64)
    emission_r = torch.randn(2, 4, 3, generator=generator, dtype=torch.float64)
    assert torch.autograd.gradcheck(objective, (emission_f.requires_grad_(True),
                                                emission_r.requires_grad_(True)))


def _agreement_ratio(cls, seed: int) -> float:
    """Disagreement between the directions' posteriors after 40 steps with agreement weight 5,
    relative to the same models, batches and steps without it; `seed`: the models' init."""
    fwd_batch = _tensors([s for s, _ in LONG_PAIRS], [t for _, t in LONG_PAIRS], "fwd")
    rev_batch = _tensors([s for s, _ in LONG_PAIRS], [t for _, t in LONG_PAIRS], "rev")
    result = {}
    for weight in (0.0, 5.0):
        pair = _pair(cls, weight, seed=seed)
        pair.train()
        optimizer = torch.optim.Adam(pair.parameters(), lr=3e-3)
        for _ in range(40):
            optimizer.zero_grad()
            loss, _ = pair.loss(*fwd_batch)
            loss.backward()
            optimizer.step()
        pair.eval()
        with torch.no_grad():
            gamma_fwd = pair.fwd.alignment_scores(*fwd_batch, "hmm-posterior")
            gamma_rev = pair.rev.alignment_scores(*rev_batch, "hmm-posterior")
        result[weight] = disagreement(gamma_fwd, gamma_rev, fwd_batch[0], fwd_batch[2]).item()
    return result[5.0] / result[0.0]


AGREEMENT = {cls.__name__: Bar(f"{cls.__name__} disagreement with agreement weight 5 / "
                               f"without", functools.partial(_agreement_ratio, cls),
                               below=0.5, margin="measured 0.001-0.020")
             for cls in (ZeroOrderHMM, FirstOrderHMM)}
BARS = list(AGREEMENT.values())


@pytest.mark.quality
@pytest.mark.parametrize("name", list(AGREEMENT))
def test_training_with_agreement_makes_the_directions_agree(name):
    """Same models, same batches, same steps: the weighted run ends with far less
    disagreement between the directions' posteriors than the unweighted one."""
    AGREEMENT[name].check(0)


# -- through the command line ----------------------------------------------------------------

#: one training run each (--rounds 1; self-training rounds: tests/test_self_training.py)
TINY = ["--bpe-merges", "0", "--d-model", "32", "--heads", "2", "--encoder-layers", "1",
        "--decoder-layers", "2", "--ff-dim", "64", "--max-tokens", "300", "--warmup", "5",
        "--lr", "3e-3", "--max-epochs", "0", "--dropout", "0", "-q", "--rounds", "1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agreement")
    sources, targets, golds = monotone_corpus(40, vocab=8, min_len=2, max_len=6, seed=3)
    return write_corpus(tmp, "train", sources, targets, golds)


def _weights(model_dir, direction, checkpoint="last"):
    return torch.load(model_dir / direction / f"params.{checkpoint}.pt",
                      weights_only=True)["state_dict"]


def test_agreement_run_writes_both_directions_and_resumes_bit_identically(tmp_path, corpus):
    src, tgt, gold = corpus
    common = ["train", "-s", src, "-t", tgt, "--model", "hmm1", *TINY, "--agreement-weight",
              "2", "--checkpoint-interval", "3", "--valid-src", src, "--valid-tgt", tgt,
              "--valid-gold", gold]
    with restored_aligner_logger():
        run(*common, "-o", tmp_path / "whole", "--max-updates", "6")
        run(*common, "-o", tmp_path / "split", "--max-updates", "3")
        run(*common, "-o", tmp_path / "split", "--max-updates", "6", "--resume")
        for name in ("whole", "split"):
            model_dir = tmp_path / name
            assert (model_dir / "joint" / "training_state.pt").is_file()
            metrics = (model_dir / "joint" / "metrics.tsv").read_text().splitlines()
            assert [row.split("\t")[0] for row in metrics[1:]] == ["3", "6"]
        for direction in ("fwd", "rev"):
            whole, split = _weights(tmp_path / "whole", direction), \
                _weights(tmp_path / "split", direction)
            assert whole.keys() == split.keys()
            assert all(torch.equal(whole[k], split[k]) for k in whole)
        # the two directions were trained (not left at their initial weights) and differ
        assert not torch.equal(_weights(tmp_path / "whole", "fwd")["lexicon.weight"],
                               _weights(tmp_path / "whole", "rev")["lexicon.weight"])
        out = tmp_path / "links.txt"
        run("extract", tmp_path / "whole", "-s", src, "-t", tgt, "-o", out, "-q")
        assert len(read_pharaoh(str(out))) == 40


def test_agreement_run_that_cannot_be_is_one_error_line(tmp_path, corpus):
    src, tgt, _ = corpus
    base = ["train", "-s", src, "-t", tgt, *TINY, "--max-updates", "2",
            "--agreement-weight", "1"]
    cases = [(["--model", "transformer"], "implemented for the direct HMMs (hmm0, hmm1), not "
                                          "'transformer'"),
             (["--model", "hmm0", "--directions", "fwd"], "it needs both (not --directions fwd)"),
             (["--model", "hmm0", "--parallel-directions"],
              "cannot be combined with --parallel-directions")]
    for k, (extra, message) in enumerate(cases):
        result = run(*base, "-o", tmp_path / f"m{k}", *extra, ok=False)
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        assert message in result.output, result.output
        assert not (tmp_path / f"m{k}").exists()


def test_resume_refuses_directions_with_weights_but_no_joint_state(tmp_path, corpus):
    src, tgt, _ = corpus
    model_dir = tmp_path / "m"
    common = ["train", "-s", src, "-t", tgt, "-o", model_dir, "--model", "hmm0", *TINY,
              "--agreement-weight", "1", "--checkpoint-interval", "2"]
    with restored_aligner_logger():
        run(*common, "--max-updates", "2")
    (model_dir / "joint" / "training_state.pt").unlink()
    result = run(*common, "--max-updates", "4", "--resume", ok=False)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "joint/training_state.pt: missing, but fwd/params.last.pt holds trained weights" \
        in result.output, result.output
