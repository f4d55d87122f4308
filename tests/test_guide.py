"""Guided alignment training (aligner/training/guidance.py, the trainer's guide term on the HMMs'
posteriors, align train --guide)."""
from __future__ import annotations

import functools
import inspect

import numpy as np
import pytest
import torch

from aligner.formats import GoldAlignment, read_pharaoh
from aligner.links.metrics import score_aer
from aligner.models import hmm_algorithms as hmm
from aligner.models.direct_hmm import FirstOrderHMM, ZeroOrderHMM
from aligner.training.guidance import check_guides, guide_cross_entropy, guide_matrix, subword_links
from aligner.training.loop import _LossModule, guided_loss
from aligner.utils import AlignerError
from conftest import restored_aligner_logger
from quality import Bar
from cli_runner import error_line, run
from synthetic import monotone_corpus, write_corpus
from test_direct_hmm import LONG_PAIRS, _batch, _model


def test_word_links_become_all_pairs_of_their_subwords():
    # source words: w0 = subwords 0,1; w1 = 2 ; target words: v0 = 0; v1 = 1,2
    links = subword_links({(0, 1), (1, 0)}, [0, 0, 1], [0, 1, 1])
    assert links.tolist() == [[0, 1], [0, 2], [1, 1], [1, 2], [2, 0]]
    assert subword_links(set(), [0], [0]).shape == (0, 2)


def test_guide_matrix_rows_are_uniform_over_linked_encoder_positions():
    links = [np.array([[0, 0], [1, 0], [2, 1]]), np.zeros((0, 2), dtype=np.int32)]
    fwd = guide_matrix(links, "fwd", 3, 4)          # rows = target subwords
    assert fwd[0].tolist() == [[0.5, 0.5, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
    assert fwd[1].abs().sum() == 0
    rev = guide_matrix(links, "rev", 4, 3)          # rows = source subwords
    assert rev[0].tolist() == [[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 0]]


def test_bad_guides_name_the_file_and_line():
    source, target = [["a", "b"], ["c"]], [["x"], ["y", "z"]]
    with pytest.raises(AlignerError, match=r"^g.txt: 1 lines, but the training bitext has 2"):
        list(check_guides([{(0, 0)}], source, target, "g.txt"))
    with pytest.raises(AlignerError, match=r"^g.txt:2: link 1-0 outside the sentence pair"):
        list(check_guides([{(1, 0)}, {(1, 0)}], source, target, "g.txt"))
    with pytest.raises(AlignerError, match=r"^g.txt: 3 lines, but the training bitext has 2"):
        list(check_guides([{(0, 0)}, set(), set()], source, target, "g.txt"))
    assert [links for links, _, _ in check_guides([{(1, 0)}, {(0, 1)}], source, target,
                                                   "g.txt")] == [{(1, 0)}, {(0, 1)}]


def _guide(src, tgt_out, diagonal=True):
    """fwd guide (B, I+1, J+1): target word i linked to source word i (or J-1-i)."""
    links = []
    for b in range(src.size(0)):
        n_src = int(src[b].ne(0).sum()) - 1
        n_tgt = int(tgt_out[b].ne(0).sum()) - 1
        links.append(np.array([[min(i, n_src - 1) if diagonal else n_src - 1 - min(i, n_src - 1),
                                i] for i in range(n_tgt)]))
    return guide_matrix(links, "fwd", tgt_out.size(1), src.size(1))


def test_hmm0_guide_term_is_the_cross_entropy_with_the_posterior():
    model = _model(ZeroOrderHMM)
    src, tgt_in, tgt_out = _batch(LONG_PAIRS)
    guide = _guide(src, tgt_out)
    plain, _ = model.loss(src, tgt_in, tgt_out)
    guided, _ = guided_loss(model, src, tgt_in, tgt_out, 0.0, guide, 0.5)
    posterior = model.alignment_scores(src, tgt_in, tgt_out, "hmm-posterior")
    expected = -(guide * posterior.clamp_min(1e-30).log()).sum()
    assert (guided - plain).item() == pytest.approx(0.5 * expected.item(), rel=1e-4)


def test_hmm1_guide_term_is_the_cross_entropy_with_the_forward_backward_posterior():
    model = _model(FirstOrderHMM)
    src, tgt_in, tgt_out = _batch(LONG_PAIRS)
    guide = _guide(src, tgt_out)
    plain, _ = model.loss(src, tgt_in, tgt_out)
    guided, _ = guided_loss(model, src, tgt_in, tgt_out, 0.0, guide, 2.0)
    posterior = model.alignment_scores(src, tgt_in, tgt_out, "hmm-posterior")
    expected = -(guide * posterior.clamp_min(1e-30).log()).sum()
    assert (guided - plain).item() == pytest.approx(2.0 * expected.item(), rel=1e-4)


def spy_training_terms(model, name, calls):
    """model.training_terms, recording (name, whether the posterior was asked for) in `calls`
    at each call."""
    hook = model.training_terms
    signature = inspect.signature(hook)

    def training_terms(*args, **kwargs):
        calls.append((name, signature.bind(*args, **kwargs).arguments.get("posterior", False)))
        return hook(*args, **kwargs)

    return training_terms


@pytest.mark.parametrize("cls", [ZeroOrderHMM, FirstOrderHMM])
def test_the_trainer_adds_the_guide_term_to_the_contracts_training_terms(cls, monkeypatch):
    """The trainer's loss module asks the model for nothing but the contract's training_terms
    (with the posterior only when guided) and adds guide_weight · guide_cross_entropy itself;
    without a guide it is the model's own loss."""
    model = _model(cls)
    src, tgt_in, tgt_out = _batch(LONG_PAIRS)
    guide = _guide(src, tgt_out)
    nll, tokens, log_posterior = model.training_terms(src, tgt_in, tgt_out, 0.1, posterior=True)
    calls = []
    monkeypatch.setattr(model, "training_terms", spy_training_terms(model, "fwd", calls))
    module = _LossModule(model)
    loss, loss_tokens = module(src, tgt_in, tgt_out, 0.1, guide=guide, guide_weight=0.5)
    assert calls == [("fwd", True)]
    assert torch.equal(loss, nll + 0.5 * guide_cross_entropy(log_posterior, guide))
    assert int(loss_tokens) == int(tokens)
    plain, _ = module(src, tgt_in, tgt_out, 0.1)
    assert calls == [("fwd", True), ("fwd", False)] and torch.equal(plain, nll)
    assert torch.equal(module(src, tgt_in, tgt_out, 0.1, guide=guide, guide_weight=0.0)[0], nll)


def test_double_backward_posterior_gradient_passes_gradcheck():
    """d CE(G, γ(E)) / d E by double backward through the forward recursion == finite
    differences (float64, with padding and masked states)."""
    generator = torch.Generator().manual_seed(3)
    emission = torch.randn(2, 4, 3, generator=generator, dtype=torch.float64)
    initial = torch.log_softmax(torch.randn(2, 3, generator=generator, dtype=torch.float64), -1)
    transition = torch.log_softmax(
        torch.randn(2, 4, 3, 3, generator=generator, dtype=torch.float64), -1)
    lengths, mask = torch.tensor([4, 3]), torch.tensor([[True] * 3, [True, True, False]])
    guide = torch.zeros(2, 4, 3, dtype=torch.float64)
    guide[0, 0, 1] = guide[0, 2, 0] = guide[1, 1, 1] = 1.0
    guide[0, 3, :2] = 0.5

    def cross_entropy(log_emission, log_transition):
        log_z = hmm.forward_log_z(log_emission, initial, log_transition, lengths, mask)
        gamma = hmm.posteriors(log_z, log_emission, create_graph=True)
        return -(guide * gamma.clamp_min(1e-300).log()).sum()

    assert torch.autograd.gradcheck(cross_entropy, (emission.requires_grad_(True),
                                                    transition.requires_grad_(True)))


def test_guided_hmm1_training_step_with_transition_chunks_matches_whole():
    src, tgt_in, tgt_out = _batch(LONG_PAIRS)
    guide = _guide(src, tgt_out)
    grads = []
    for chunk_floats in (0, 400):
        model = _model(FirstOrderHMM, chunk_floats=chunk_floats)
        model.train()
        loss, _ = guided_loss(model, src, tgt_in, tgt_out, 0.1, guide, 1.0)
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()
                                if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-6)


# -- through the command line ----------------------------------------------------------------

TINY = ["--bpe-merges", "0", "--d-model", "32", "--heads", "2", "--encoder-layers", "1",
        "--decoder-layers", "2", "--ff-dim", "64", "--max-tokens", "300", "--warmup", "5",
        "--lr", "3e-3", "--max-updates", "60", "--max-epochs", "0", "--checkpoint-interval", "60",
        "--directions", "fwd", "--dropout", "0", "-q"]


@functools.lru_cache(maxsize=None)
def _guided_runs(seed: int):
    """hmm0 fwd on a synthetic corpus where every sentence repeats ONE word (the lexicon cannot
    tell the positions apart): without a guide the alignment is arbitrary; the diagonal guide
    (= gold) and the reversed guide at a high weight decide it. Returns (the AER of each run's
    output against the gold and against the reversed links, whether weight 0 gave the unguided
    output); `seed`: the corpus and --seed."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        sources, targets, golds = monotone_corpus(60, vocab=1, min_len=3, max_len=6,
                                                  seed=1 + seed)
        src, tgt, gold = write_corpus(tmp, "train", sources, targets, golds)
        reversed_links = [{(len(s) - 1 - i, j) for i, j in g} for s, g in zip(sources, golds)]
        reverse = tmp / "reversed.talp"
        reverse.write_text("".join(" ".join(f"{i}-{j}" for i, j in sorted(g)) + "\n"
                                   for g in reversed_links))
        results = {}
        with restored_aligner_logger():
            for name, extra in (("none", []), ("gold", ["--guide", gold]),
                                ("reversed", ["--guide", reverse, "--guide-weight", "5"]),
                                ("reversed-weight-0", ["--guide", reverse,
                                                       "--guide-weight", "0"])):
                model = tmp / f"model-{name}"
                run("train", "-s", src, "-t", tgt, "-o", model, "--model", "hmm0", *TINY,
                    "--seed", 1 + seed, *extra)
                out = tmp / f"{name}.txt"
                run("extract", model, "-s", src, "-t", tgt, "--direction", "fwd", "-m",
                    "hmm-posterior", "-o", out, "-q")
                results[name] = read_pharaoh(str(out))
    references = {"gold": [GoldAlignment(g, set()) for g in golds],
                  "reversed": [GoldAlignment(g, set()) for g in reversed_links]}
    aers = {(name, reference): score_aer(links, references[reference]).aer
            for name, links in results.items() for reference in references}
    return aers, results["reversed-weight-0"] == results["none"]


def _guide_bar(name: str, measure, margin: str, **bar) -> Bar:
    return Bar(name, lambda seed: measure(_guided_runs(seed)[0]), margin=f"measured {margin}",
               **bar)


GUIDE = {
    "gold learned": _guide_bar("AER of the gold-guided run", lambda a: a["gold", "gold"],
                               "0.000-0.071", below=0.2),
    "gold gain": _guide_bar("AER gained by the gold guide",
                            lambda a: a["none", "gold"] - a["gold", "gold"], "0.567-0.874",
                            above=0.3),
    "reversed followed": _guide_bar("AER of the reversed-guided run against the reversed "
                                    "links", lambda a: a["reversed", "reversed"], "0.000-0.421",
                                    below=0.6),
    "reversed not gold": _guide_bar("AER of the reversed-guided run against the gold",
                                    lambda a: a["reversed", "gold"], "0.878-0.968", above=0.75),
    "reversed gain": _guide_bar("AER against the reversed links gained by the reversed guide",
                                lambda a: a["none", "reversed"] - a["reversed", "reversed"],
                                "0.368-0.857", above=0.2)}
BARS = list(GUIDE.values())


@pytest.mark.quality
def test_a_correct_guide_is_learned_and_a_weighted_wrong_one_is_followed():
    aers, weight_0_is_no_guide = _guided_runs(0)
    for bar in GUIDE.values():   # followed, as its weight says
        bar.check(0)
    # weight 0 is no guide at all: the same model as unguided training
    assert weight_0_is_no_guide


def test_bad_guide_files_are_one_error_line(tmp_path):
    sources, targets, golds = monotone_corpus(5, seed=2)
    src, tgt, gold = write_corpus(tmp_path, "train", sources, targets, golds)
    short = tmp_path / "short.talp"
    short.write_text("0-0\n")
    outside = tmp_path / "outside.talp"
    outside.write_text("0-0\n" * 2 + "0-9\n" + "0-0\n" * 2)
    for guide, message in ((short, "short.talp: 1 lines, but the training bitext has 5"),
                           (outside, "outside.talp:3: link 0-9 outside the sentence pair")):
        result = run("train", "-s", src, "-t", tgt, "-o", tmp_path / "m", "--model", "hmm0",
                     *TINY, "--guide", guide, "--overwrite", ok=False)
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert message in result.output, result.output
    result = run("train", "-s", src, "-t", tgt, "-o", tmp_path / "t", "--model", "transformer",
                 *TINY, "--guide", gold, ok=False)
    assert result.exit_code == 1 and "guided alignment training is implemented for hmm0, " \
                                      "hmm1 and alignment-layer, not 'transformer'" in result.output
    assert not (tmp_path / "t").exists()


def test_a_guide_weight_without_a_guide_is_refused(tmp_path):
    """--guide-weight changes nothing without a guide: refused in one line, before anything is
    written (align train of hmm0 and of the unguided 2019 layer, and align run, whose rounds
    take --self-guide-weight)."""
    sources, targets, _ = monotone_corpus(5, seed=2)
    src, tgt, _ = write_corpus(tmp_path, "train", sources, targets, None)
    commands = {"hmm0": ("train", "-s", src, "-t", tgt, "-o", tmp_path / "m", "--model", "hmm0",
                         *TINY),
                "layer": ("train", "-s", src, "-t", tgt, "-o", tmp_path / "m", "--model",
                          "alignment-layer", "--layer-query", "prefix"),
                "run": ("run", "-s", src, "-t", tgt, "-o", tmp_path / "out.align",
                        "--model-dir", tmp_path / "m")}
    for name, command in commands.items():
        line = error_line(run(*command, "--guide-weight", "5", ok=False))
        assert "--guide-weight 5: this run has no guide" in line, (name, line)
        assert not (tmp_path / "m").exists() and not (tmp_path / "out.align").exists(), name


def test_damaged_guide_links_are_one_error_line(tmp_path):
    from aligner.training.guidance import GuideLinks, save_guides

    save_guides(str(tmp_path), [np.array([[0, 0]]), np.zeros((0, 2), dtype=np.int32)])
    assert GuideLinks.open(str(tmp_path), 2).pair(0).tolist() == [[0, 0]]
    assert GuideLinks.open(str(tmp_path / "none"), 2) is None
    with pytest.raises(AlignerError, match=r"guide.links.npy: damaged \(guide links do not fit "
                                           r"the 3 pairs\); train again with --overwrite"):
        GuideLinks.open(str(tmp_path), 3)
    for content in (b"garbage", b""):                      # not .npy, empty (EOFError)
        (tmp_path / "guide.links.npy").write_bytes(content)
        with pytest.raises(AlignerError, match=r"guide.links.npy: damaged \(guide links: "):
            GuideLinks.open(str(tmp_path), 2)
