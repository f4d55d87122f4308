"""The Python API (aligner.api.Aligner): same links as `align extract`, probabilities whose
argmax gives the links, input forms, direction flipping, and one-line errors."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from aligner import constants as C
from aligner.config import RunConfig
from aligner.extract.inference import extract
from aligner.formats import Bitext
from aligner.model_dir import save_params
from aligner.models import MODELS
from aligner.prep import PrepConfig, Preprocessor
from aligner.training.loop import seed_everything
from aligner.utils import AlignerError
from aligner.vocab import Vocabulary
from synthetic import monotone_corpus


def make_model_dir(tmp_path, kind="transformer"):
    """A model directory of untrained tiny `kind` models (whole words, no BPE)."""
    sources, targets, golds = monotone_corpus(20, seed=1)
    pre = Preprocessor(PrepConfig(bpe_merges=0))
    src_vocab, tgt_vocab = Vocabulary.build(sources), Vocabulary.build(targets)
    cls = MODELS[kind]
    models = {}
    for direction in C.DIRECTIONS:
        sizes = (len(src_vocab), len(tgt_vocab))
        sizes = sizes if direction == "fwd" else sizes[::-1]
        seed_everything(3 if direction == "fwd" else 4)
        models[direction] = cls(cls.config_class(*sizes, d_model=16, n_heads=2, enc_layers=1,
                                                 dec_layers=2, d_ff=32, max_positions=16))
    directory = tmp_path / f"model-{kind}"
    directory.mkdir()
    RunConfig(kind, list(C.DIRECTIONS), {d: m.config.to_dict() for d, m in models.items()},
              pre.config.to_dict()).save(str(directory / C.CONFIG_NAME))
    pre.save(str(directory))
    src_vocab.save(str(directory / C.VOCAB_SRC))
    tgt_vocab.save(str(directory / C.VOCAB_TGT))
    for direction, model in models.items():
        (directory / direction).mkdir()
        save_params(model, str(directory / direction / C.PARAMS_BEST))
    return directory, sources, targets, golds


@pytest.fixture(scope="module")
def transformer_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("api"))


@pytest.fixture(scope="module")
def aligner(transformer_dir):
    from aligner import Aligner
    return Aligner.load(str(transformer_dir[0]), device="cpu")


def test_links_equal_align_extract_for_every_direction(transformer_dir, aligner):
    """The API aligns as aligner.extract does (both in float32 here: the default precision
    is align extract's, bf16 on a CPU with bfloat16 instructions)."""
    from aligner import Aligner

    aligner = Aligner.load(str(transformer_dir[0]), device="cpu", precision="fp32")
    directory, sources, targets, _ = transformer_dir
    src, tgt = sources[:6], targets[:6]
    bitext = Bitext(src, tgt, "s", "t")
    for direction in ("fwd", "rev", "both"):
        for method in aligner.methods:
            expected = extract(aligner.loaded, bitext, method, direction)
            assert aligner.align(src, tgt, method, direction) == expected
    union = extract(aligner.loaded, bitext, "attention", "both", "union")
    assert aligner.align(src, tgt, heuristic="union") == union
    # strings are split on whitespace and give the same result as word lists
    as_text = aligner.align([" ".join(s) for s in src], ["  ".join(t) + " " for t in tgt])
    assert as_text == aligner.align(src, tgt)
    assert all(isinstance(link, tuple) for links in as_text for link in links)


@pytest.mark.parametrize("direction", ["fwd", "rev"])
def test_probabilities_are_normalized_and_their_argmax_is_the_link(aligner, transformer_dir,
                                                                   direction):
    _, sources, targets, _ = transformer_dir
    results = aligner.align(sources[:5], targets[:5], "attention-avg", direction,
                            return_probabilities=True)
    assert len(results) == 5
    for (links, probabilities), src, tgt in zip(results, sources, targets):
        assert set(probabilities) == {direction}
        matrix = probabilities[direction]
        assert matrix.shape == (len(src), len(tgt)) and matrix.dtype == np.float32
        if direction == "fwd":   # p(source word | target word): columns sum to 1
            assert np.allclose(matrix.sum(axis=0), 1.0, atol=1e-5)
            expected = {(int(matrix[:, j].argmax()), j) for j in range(len(tgt))}
        else:                    # p(target word | source word): rows sum to 1
            assert np.allclose(matrix.sum(axis=1), 1.0, atol=1e-5)
            expected = {(i, int(matrix[i].argmax())) for i in range(len(src))}
        assert links == expected   # whole words, no BPE: the hard link is the argmax


def test_both_directions_give_both_matrices_and_the_symmetrized_links(aligner, transformer_dir):
    from aligner.links.symmetrize import symmetrize
    _, sources, targets, _ = transformer_dir
    (links, probabilities), = aligner.align(sources[:1], targets[:1], heuristic="intersect",
                                            return_probabilities=True)
    assert set(probabilities) == {"fwd", "rev"}
    fwd = aligner.align(sources[:1], targets[:1], direction="fwd")[0]
    rev = aligner.align(sources[:1], targets[:1], direction="rev")[0]
    assert links == symmetrize(fwd, rev, "intersect") == fwd & rev


def test_soft_average_thresholds_the_mean_of_the_two_matrices(aligner, transformer_dir):
    import numpy as np
    _, sources, targets, _ = transformer_dir
    results = aligner.align(sources[:4], targets[:4], return_probabilities=True)
    for threshold in (0.5, 0.2):
        links = aligner.align(sources[:4], targets[:4], heuristic="soft-average",
                              threshold=threshold)
        for pair_links, (_, probabilities) in zip(links, results):
            mean = (probabilities["fwd"] + probabilities["rev"]) / 2
            assert pair_links == {(int(i), int(j)) for i, j in zip(*np.nonzero(mean > threshold))}


def test_empty_sentence_gets_no_links_and_a_zero_matrix_in_place(aligner, transformer_dir):
    _, sources, targets, _ = transformer_dir
    results = aligner.align([sources[0], "", sources[1]], [targets[0], targets[1], targets[1]],
                            direction="fwd", return_probabilities=True)
    assert results[1][0] == set()
    assert results[1][1]["fwd"].shape == (0, len(targets[1]))
    assert results[0][0] == aligner.align(sources[:1], targets[:1], direction="fwd")[0]
    assert results[2][0] == aligner.align(sources[1:2], targets[1:2], direction="fwd")[0]


def test_hmm1_methods_through_the_api(tmp_path):
    from aligner import Aligner
    directory, sources, targets, _ = make_model_dir(tmp_path, "hmm1")
    aligner = Aligner.load(str(directory), device="cpu", directions=("fwd",))
    assert aligner.model_kind == "hmm1" and aligner.directions == ("fwd",)
    assert aligner.methods == MODELS["hmm1"].METHODS
    bitext = Bitext(sources[:4], targets[:4], "s", "t")
    for method in aligner.methods:
        assert aligner.align(sources[:4], targets[:4], method, "fwd") == \
            extract(aligner.loaded, bitext, method, "fwd")
    (links, probabilities), = aligner.align(sources[:1], targets[:1], "hmm-posterior", "fwd",
                                            return_probabilities=True)
    matrix = probabilities["fwd"]
    assert np.allclose(matrix.sum(axis=0), 1.0, atol=1e-5)
    assert links == {(int(matrix[:, j].argmax()), j) for j in range(len(targets[0]))}
    with pytest.raises(AlignerError, match="direction rev was not loaded"):
        aligner.align(sources[:1], targets[:1])
    both = Aligner.load(str(directory), device="cpu")     # no heuristic: the kind's best
    assert both.align(sources[:4], targets[:4]) == \
        both.align(sources[:4], targets[:4], heuristic="soft-average") != \
        both.align(sources[:4], targets[:4], heuristic="grow-diag")


@pytest.mark.parametrize("call, message", [
    (lambda a: a.align([["a"]], [["b"], ["c"]]), r"tgt:2: line counts differ"),
    (lambda a: a.align([["a"]], [["b"]], method="hmm-viterbi"),
     r"unknown method 'hmm-viterbi' for model kind 'transformer' \(choose from attention, "
     r"attention-avg\)"),
    (lambda a: a.align("s1 s2", "t1 t2"), r"src: expected a list of sentences, got one string"),
    (lambda a: a.align([3], ["t1"]), r"src\[0\]: a sentence must be a string or a list"),
    (lambda a: a.align([["s1"]], [["t1"]], direction="up"), r"direction must be fwd, rev or"),
    (lambda a: a.align([["s1"]], [["t1"]], heuristic="diag"), r"unknown heuristic 'diag'"),
    (lambda a: a.align([["s1"]], [["t1"]], subword_pooling="sum"),
     r"subword pooling must be one of mean, max, not 'sum'"),
])
def test_bad_input_is_one_aligner_error(aligner, call, message):
    with pytest.raises(AlignerError, match=message):
        call(aligner)


def test_load_errors(tmp_path):
    from aligner import Aligner
    with pytest.raises(AlignerError, match="no such model directory"):
        Aligner.load(str(tmp_path / "missing"), device="cpu")


def test_package_import_stays_torch_free_until_aligner_is_used():
    code = ("import sys, aligner; assert 'torch' not in sys.modules; "
            "from aligner import Aligner; assert 'torch' not in sys.modules; "
            "assert Aligner.__module__ == 'aligner.api'\n"
            "try:\n    aligner.Nope\nexcept AttributeError as e:\n    print('ok', e)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "ok module 'aligner' has no attribute 'Nope'" in result.stdout


def test_method_options_reach_the_method(tmp_path):
    """layer-sgd with 0 steps from the forward attention is the plain layer argmax; a bad
    option is the method's one-line error."""
    from aligner import Aligner
    directory, sources, targets, _ = make_model_dir(tmp_path, "alignment-layer")
    aligner = Aligner.load(str(directory), device="cpu")
    layer = aligner.align(sources[:4], targets[:4], "layer")
    assert aligner.align(sources[:4], targets[:4], "layer-sgd", sgd_steps=0) == layer
    assert aligner.align(sources[:4], targets[:4], "layer-sgd", sgd_steps=0,
                         init="random") != layer
    with pytest.raises(AlignerError, match="unknown method 'hmm-posterior' for model kind "
                                           "'alignment-layer'"):
        aligner.align(sources[:1], targets[:1], "hmm-posterior")
    with pytest.raises(AlignerError, match="method 'layer' takes no option"):
        aligner.align(sources[:1], targets[:1], "layer", sgd_steps=2)
