"""Extraction: masking, the hard-path hook, direction flipping, subword->word links, order kept
with blank lines and any batch size, warnings, and the whole path from a model directory."""
from __future__ import annotations

import logging
from typing import Tuple

import numpy as np
import pytest
import torch

from aligner import constants as C
from aligner.config import RunConfig
from aligner.data import EncodedPair, encode_pair
from aligner.extract.inference import align_pairs, extract, extract_all, hard_alignment
from aligner.formats import Bitext
from aligner.links.symmetrize import symmetrize
from aligner.model_dir import LoadedModelDir, save_params
from aligner.models.base import AlignmentModel
from aligner.models.transformer import Transformer, TransformerConfig
from aligner.prep import PrepConfig, Preprocessor
from aligner.training.loop import seed_everything
from aligner.utils import AlignerError
from aligner.vocab import Vocabulary
from synthetic import monotone_corpus


class FixedScores(AlignmentModel):
    """A fake model whose scores are given per call: scores[b, i, j] = table[i][j]."""

    METHODS: Tuple[str, ...] = ("fixed", "path")
    config_class = TransformerConfig

    def __init__(self, table, path=None):
        super().__init__()
        self.config = TransformerConfig(8, 8)      # only max_positions is read (1024)
        self.table = torch.tensor(table, dtype=torch.float32)
        self.path = path
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def loss(self, src, tgt_in, tgt_out, label_smoothing=0.0):
        raise NotImplementedError("extraction only")

    def init_decode_state(self, src, **options):
        raise NotImplementedError("extraction only")

    def decode_step(self, state, prev_tokens):
        raise NotImplementedError("extraction only")

    def alignment_scores(self, src, tgt_in, tgt_out, method, **options):
        rows, cols = tgt_out.size(1), src.size(1)
        return self.table[:rows, :cols].expand(src.size(0), rows, cols)

    def alignment_path(self, src, tgt_in, tgt_out, method, **options):
        if method != "path":
            return None
        return torch.tensor(self.path).expand(src.size(0), -1)


def tensors(src_ids, tgt_ids):
    src = torch.tensor([src_ids + [C.EOS_ID]])
    tgt_in = torch.tensor([[C.BOS_ID] + tgt_ids])
    tgt_out = torch.tensor([tgt_ids + [C.EOS_ID]])
    return src, tgt_in, tgt_out


def test_argmax_never_picks_eos_or_pad_and_eos_row_is_unaligned():
    # 2 source subwords + EOS, 2 target subwords + EOS; EOS column has the largest scores
    model = FixedScores([[0.1, 0.3, 9.0], [0.5, 0.2, 9.0], [0.9, 0.0, 9.0]])
    path = hard_alignment(model, *tensors([5, 6], [7, 8]), "fixed")
    assert path.tolist() == [[1, 0, -1]]
    padded = FixedScores([[0.0, 0.1, 5.0, 7.0]])
    src = torch.tensor([[5, C.EOS_ID, C.PAD_ID, C.PAD_ID]])  # one real source word
    path = hard_alignment(padded, src, torch.tensor([[C.BOS_ID]]), torch.tensor([[9]]), "fixed")
    assert path.tolist() == [[0]]


def test_hard_path_hook_is_used_and_cleaned():
    # the model's own path: target 0 -> source 1, target 1 -> EOS (dropped), EOS row (dropped)
    model = FixedScores([[0.0] * 3] * 3, path=[1, 2, 0])
    assert hard_alignment(model, *tensors([5, 6], [7, 8]), "path").tolist() == [[1, -1, -1]]
    model = FixedScores([[0.0, 1.0, 0.0]] * 3, path=[-1, 0, 0])
    assert hard_alignment(model, *tensors([5, 6], [7, 8]), "path").tolist() == [[-1, 0, -1]]
    # method without a path: argmax of the scores
    assert hard_alignment(model, *tensors([5, 6], [7, 8]), "fixed").tolist() == [[1, 1, -1]]


def pair(src_ids, tgt_ids, src_words=None, tgt_words=None) -> EncodedPair:
    return EncodedPair(np.array(src_ids, dtype=np.int64), np.array(tgt_ids, dtype=np.int64),
                       src_words if src_words is not None else list(range(len(src_ids))),
                       tgt_words if tgt_words is not None else list(range(len(tgt_ids))))


def test_directions_are_flipped_to_source_target():
    # encoder side has 3 subwords, decoder side 2; decoder i -> encoder j by the table
    table = [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0] * 4]
    model = FixedScores(table)
    fwd = align_pairs(model, [pair([5, 6, 7], [8, 9])], "fwd", "fixed")
    assert fwd == [{(1, 0), (2, 1)}]          # (source word, target word)
    rev = align_pairs(model, [pair([8, 9], [5, 6, 7])], "rev", "fixed")
    assert rev == [{(0, 1), (1, 2)}]          # decoder = source language here


def test_subword_links_become_word_links():
    # source words: "a b@@ c" -> subwords 0 | 1 2 ; target words: "x@@ y z" -> 0 0 | 1
    table = [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0] * 4]
    model = FixedScores(table)
    links = align_pairs(model, [pair([5, 6, 7], [8, 9, 10], [0, 1, 1], [0, 0, 1])], "fwd",
                        "fixed")
    assert links == [{(0, 0), (1, 0), (1, 1)}]


def test_unknown_method_is_a_user_error():
    with pytest.raises(AlignerError, match="unknown method 'attention'"):
        align_pairs(FixedScores([[0.0]]), [pair([5], [6])], "fwd", "attention")


@pytest.fixture(scope="module")
def tiny_transformer():
    seed_everything(0)
    return Transformer(TransformerConfig(30, 30, d_model=16, n_heads=2, enc_layers=1,
                                         dec_layers=2, d_ff=32, dropout=0.0,
                                         max_positions=12)).eval()


def random_pairs(n, seed=0):
    rng = np.random.default_rng(seed)
    pairs = []
    for k in range(n):
        if k % 5 == 2:       # a blank source line
            pairs.append(pair([], list(rng.integers(4, 30, 3))))
        elif k % 7 == 4:     # a blank target line
            pairs.append(pair(list(rng.integers(4, 30, 2)), []))
        else:
            pairs.append(pair(list(rng.integers(4, 30, rng.integers(1, 9))),
                              list(rng.integers(4, 30, rng.integers(1, 9)))))
    return pairs


@pytest.mark.parametrize("direction", ["fwd", "rev"])
def test_order_kept_with_blank_lines_for_any_batch_size(tiny_transformer, direction):
    pairs = random_pairs(17)
    one_by_one = [align_pairs(tiny_transformer, [p], direction, "attention")[0] for p in pairs]
    assert all(links == set() for k, links in enumerate(one_by_one) if k % 5 == 2 or k % 7 == 4)
    assert sum(1 for links in one_by_one if links) >= 12
    for max_tokens in (1, 30, 10 ** 6):  # batch sizes 1, about 3, all
        batched = align_pairs(tiny_transformer, pairs, direction, "attention",
                              max_tokens=max_tokens)
        assert batched == one_by_one


def test_over_long_pairs_get_an_empty_alignment(tiny_transformer):
    long_pair = pair(list(range(4, 16)), [5, 6])     # 12 subwords + EOS > max_positions 12
    short = pair([5, 6], [7])
    result = align_pairs(tiny_transformer, [long_pair, short], "fwd", "attention")
    assert result[0] == set() and result[1] != set()


def test_attention_links_are_the_argmax_of_the_attention(tiny_transformer):
    p = pair([5, 6, 7, 8], [9, 10, 11])
    from aligner.data import make_batch
    batch = make_batch([p.src_ids], [p.tgt_ids], "fwd")
    with torch.no_grad():
        scores = tiny_transformer.alignment_scores(batch.src, batch.tgt_in, batch.tgt_out,
                                                   "attention-avg")[0]
    expected = {(int(scores[i, :4].argmax()), i) for i in range(3)}
    assert align_pairs(tiny_transformer, [p], "fwd", "attention-avg") == [expected]


def make_model_dir(tmp_path, max_positions=16):
    """A model directory with untrained tiny transformers (whole words, no BPE)."""
    sources, targets, _ = monotone_corpus(20, seed=1)
    pre = Preprocessor(PrepConfig(bpe_merges=0))
    src_vocab, tgt_vocab = Vocabulary.build(sources), Vocabulary.build(targets)
    models = {}
    for direction in C.DIRECTIONS:
        sizes = (len(src_vocab), len(tgt_vocab))
        sizes = sizes if direction == "fwd" else sizes[::-1]
        seed_everything(3)
        models[direction] = Transformer(TransformerConfig(*sizes, d_model=16, n_heads=2,
                                                          enc_layers=1, dec_layers=2, d_ff=32,
                                                          max_positions=max_positions))
    directory = tmp_path / "model"
    directory.mkdir()
    RunConfig("transformer", list(C.DIRECTIONS),
              {d: m.config.to_dict() for d, m in models.items()},
              pre.config.to_dict()).save(str(directory / C.CONFIG_NAME))
    pre.save(str(directory))
    src_vocab.save(str(directory / C.VOCAB_SRC))
    tgt_vocab.save(str(directory / C.VOCAB_TGT))
    for direction, model in models.items():
        (directory / direction).mkdir()
        save_params(model, str(directory / direction / C.PARAMS_BEST))
    return directory, sources, targets


def test_extract_from_model_directory_symmetrizes_and_warns(tmp_path, caplog):
    directory, sources, targets = make_model_dir(tmp_path)
    loaded = LoadedModelDir.load(str(directory))
    src = [sources[0], [], sources[1], ["s1"] * 20]
    tgt = [targets[0], targets[2], targets[1], ["t1"] * 3]
    bitext = Bitext(src, tgt, "in.src", "in.tgt")
    with caplog.at_level(logging.WARNING, logger="aligner"):
        everything = extract_all(loaded, bitext, "attention", heuristics=("intersect",
                                                                          "grow-diag"))
    assert "in.src:2: an empty side" in caplog.text
    assert "in.src:4: 21 positions > the model's limit of 16" in caplog.text
    assert set(everything) == {"fwd", "rev", "intersect", "grow-diag"}
    for name, alignments in everything.items():
        assert len(alignments) == 4 and alignments[1] == set() and alignments[3] == set()
    assert everything["intersect"] == [symmetrize(f, r, "intersect")
                                       for f, r in zip(everything["fwd"], everything["rev"])]
    # links are word indices inside each sentence, source first
    for k in (0, 2):
        assert all(i < len(src[k]) and j < len(tgt[k]) for i, j in everything["fwd"][k])
        assert everything["fwd"][k]  # every target word gets one link
        assert {j for _, j in everything["fwd"][k]} == set(range(len(tgt[k])))
        assert {i for i, _ in everything["rev"][k]} == set(range(len(src[k])))
    assert extract(loaded, bitext, "attention", "rev") == everything["rev"]
    assert extract(str(directory), bitext, "attention", "rev") == everything["rev"]  # a path
    assert extract(loaded, bitext, "attention") == everything["grow-diag"]
    # soft-average: extract's shortcut (no hard links) == extract_all's, and a real threshold
    soft = extract_all(loaded, bitext, "attention", heuristics=("soft-average",),
                       threshold=0.3)["soft-average"]
    assert extract(loaded, bitext, "attention", heuristic="soft-average", threshold=0.3) == soft
    assert soft[1] == set() and soft[3] == set()


def test_extract_maps_pairs_through_bpe(tmp_path):
    """The pipeline with real BPE: word links equal the subword links mapped by word_index."""
    sources = [["lowest", "newer", "wider"], ["newest", "lower"]] * 5
    targets = [["plus", "bas", "nouveau"], ["nouvelle", "basse"]] * 5
    pre = Preprocessor.learn(PrepConfig(bpe_merges=15, bpe_min_frequency=1), sources, targets)
    src_vocab = Vocabulary.build(pre.segment(s, "src").subwords for s in sources)
    tgt_vocab = Vocabulary.build(pre.segment(t, "tgt").subwords for t in targets)
    p = encode_pair(pre, src_vocab, tgt_vocab, sources[0], targets[0])
    assert len(p.src_ids) > 3  # some words are split
    seed_everything(0)
    model = Transformer(TransformerConfig(len(src_vocab), len(tgt_vocab), d_model=16, n_heads=2,
                                          enc_layers=1, dec_layers=1, d_ff=16)).eval()
    from aligner.data import make_batch
    batch = make_batch([p.src_ids], [p.tgt_ids], "fwd")
    path = hard_alignment(model, batch.src, batch.tgt_in, batch.tgt_out, "attention")[0]
    expected = {(p.src_word_index[j], p.tgt_word_index[i])
                for i, j in enumerate(path.tolist()) if j >= 0}
    assert align_pairs(model, [p], "fwd", "attention") == [expected]
    assert {j for _, j in expected} == {0, 1, 2}


def test_model_directory_errors(tmp_path):
    directory, _, _ = make_model_dir(tmp_path)
    with pytest.raises(AlignerError, match="no such model directory"):
        LoadedModelDir.load(str(tmp_path / "nope"))
    (directory / "rev" / C.PARAMS_BEST).unlink()
    with pytest.raises(AlignerError, match=r"rev/params.best.pt: missing \(model directory "
                                           r"incomplete\)"):
        LoadedModelDir.load(str(directory))
    assert LoadedModelDir.load(str(directory), ["fwd"]).models.keys() == {"fwd"}
    (directory / C.VOCAB_TGT).unlink()
    with pytest.raises(AlignerError, match="vocab.tgt.json: missing"):
        LoadedModelDir.load(str(directory), ["fwd"])
    (directory / C.CONFIG_NAME).write_text("{not json")
    with pytest.raises(AlignerError, match="config.json: not valid JSON"):
        LoadedModelDir.load(str(directory), ["fwd"])


def test_soft_alignments_by_hand():
    """Rows renormalized over real source subwords, summed within source words, averaged over
    the subwords of each target word; EOS column and row ignored."""
    from aligner.extract.inference import soft_alignments

    table = [[1.0, 1.0, 2.0, 99.0], [0.0, 2.0, 2.0, 99.0], [3.0, 1.0, 0.0, 99.0], [5.0] * 4]
    model = FixedScores(table)
    fwd_pair = pair([5, 6, 7], [8, 9, 10], [0, 1, 1], [0, 0, 1])
    (matrix,) = soft_alignments(model, [fwd_pair], "fwd", "fixed")
    assert matrix.shape == (2, 2)  # (source words, target words)
    assert np.allclose(matrix, [[0.125, 0.75], [0.875, 0.25]])
    # rev: the decoder reads the source language; the result keeps source x target order
    rev_pair = pair([8, 9, 10], [5, 6, 7], [0, 0, 1], [0, 1, 1])
    (matrix,) = soft_alignments(model, [rev_pair], "rev", "fixed")
    assert np.allclose(matrix, [[0.125, 0.875], [0.75, 0.25]])
    empty = pair([], [5, 6], [], [0, 1])
    assert soft_alignments(model, [empty], "fwd", "fixed")[0].shape == (0, 2)


def test_max_pooling_takes_each_words_most_aligned_subword_by_hand():
    """The rows of test_soft_alignments_by_hand: target word 0 (subwords 0, 1) by source word
    [0.25, 0.75] and [0.0, 1.0]: their maximum [0.25, 1.0], not their mean [0.125, 0.875];
    target word 1 has one subword, the same row either way."""
    from aligner.extract.inference import soft_alignments, word_matrix

    table = [[1.0, 1.0, 2.0, 99.0], [0.0, 2.0, 2.0, 99.0], [3.0, 1.0, 0.0, 99.0], [5.0] * 4]
    model = FixedScores(table)
    fwd_pair = pair([5, 6, 7], [8, 9, 10], [0, 1, 1], [0, 0, 1])
    (matrix,) = soft_alignments(model, [fwd_pair], "fwd", "fixed", pooling="max")
    assert np.allclose(matrix, [[0.25, 0.75], [1.0, 0.25]])
    rev_pair = pair([8, 9, 10], [5, 6, 7], [0, 0, 1], [0, 1, 1])
    (matrix,) = soft_alignments(model, [rev_pair], "rev", "fixed", pooling="max")
    assert np.allclose(matrix, [[0.25, 1.0], [0.75, 0.25]])
    with pytest.raises(AlignerError, match="subword pooling must be one of mean, max, not 'sum'"):
        word_matrix(np.ones((4, 4)), fwd_pair, "fwd", pooling="sum")


def test_extraction_keeps_the_unaligned_mass_of_a_model_with_an_empty_word():
    """leaves_unaligned_mass: soft rows are not renormalized, so a target word's column sums to
    its probability of being aligned (the EOS column is dropped, its mass counts as unaligned);
    a hard link only where the best score is at least the unaligned mass (1 − row sum)."""
    from aligner.data import make_batch
    from aligner.extract.inference import soft_alignments

    table = [[0.1, 0.1, 0.2, 0.6], [0.0, 0.2, 0.2, 0.6], [0.3, 0.1, 0.0, 0.6], [0.25] * 4]
    model = FixedScores(table)
    model.leaves_unaligned_mass = lambda method: method == "fixed"
    fwd_pair = pair([5, 6, 7], [8, 9, 10], [0, 1, 1], [0, 0, 1])
    (matrix,) = soft_alignments(model, [fwd_pair], "fwd", "fixed")
    # target word 0 = subwords 0, 1: mean of their rows; source word 1 = subwords 1, 2
    assert np.allclose(matrix, [[0.05, 0.3], [0.35, 0.1]])
    assert np.allclose(matrix.sum(axis=0), [0.4, 0.4])
    # hard: row 0 best 0.2 < 0.6 unaligned; a row whose best beats the rest links
    model.table = torch.tensor([[0.1, 0.1, 0.2, 0.6], [0.0, 0.7, 0.2, 0.1],
                                [0.3, 0.1, 0.0, 0.6], [0.25] * 4])
    batch = make_batch([fwd_pair.src_ids], [fwd_pair.tgt_ids], "fwd")
    path = hard_alignment(model, batch.src, batch.tgt_in, batch.tgt_out, "fixed")
    assert path[0].tolist() == [-1, 1, -1, -1]
    model.leaves_unaligned_mass = lambda method: False          # the usual argmax
    path = hard_alignment(model, batch.src, batch.tgt_in, batch.tgt_out, "fixed")
    assert path[0].tolist() == [2, 1, 0, -1]


@pytest.mark.parametrize("heuristic", ["grow-diag", "soft-average"])
def test_extract_shows_one_progress_bar_over_the_input_unless_quiet(tmp_path, heuristic):
    """One bar (total = input lines, with rate and ETA) over the whole corpus, none per
    direction or pass; silent with -q."""
    from click.testing import CliRunner

    from aligner.cli import main as cli

    directory, sources, targets = make_model_dir(tmp_path)
    (tmp_path / "in.src").write_text("\n".join(" ".join(s) for s in sources[:5]) + "\n")
    (tmp_path / "in.tgt").write_text("\n".join(" ".join(t) for t in targets[:5]) + "\n")
    args = ["extract", str(directory), "-s", str(tmp_path / "in.src"), "-t",
            str(tmp_path / "in.tgt"), "-H", heuristic, "-o", str(tmp_path / "out.txt")]
    loud = CliRunner().invoke(cli, args)
    assert loud.exit_code == 0, loud.output
    lines = loud.stderr.replace("\r", "\n").splitlines()
    bars = {line.split(":")[0] for line in lines if "pair" in line and "/5" in line}
    assert bars == {"align"}, loud.stderr          # tqdm: "align: 100%|...| 5/5 [00:01<00:00, ..
    assert any("5/5" in line and "pair/s" in line for line in lines)
    assert not any(direction in line for line in lines for direction in C.DIRECTIONS)
    quiet = CliRunner().invoke(cli, args + ["-q"])
    assert quiet.exit_code == 0 and "5/5" not in quiet.stderr


def test_warnings_name_the_file_of_the_side_that_is_empty_or_too_long(tmp_path, caplog):
    directory, sources, targets = make_model_dir(tmp_path)
    loaded = LoadedModelDir.load(str(directory))
    src = [sources[0], ["s1"] * 20, sources[1], ["s1"] * 20]
    tgt = [[], targets[0], ["t1"] * 20, ["t1"] * 20]
    with caplog.at_level(logging.WARNING, logger="aligner"):
        extract_all(loaded, Bitext(src, tgt, "in.src", "in.tgt"), "attention", ("fwd",), ())
    assert "in.tgt:1: an empty side" in caplog.text
    assert "in.src:2: 21 positions > the model's limit of 16" in caplog.text
    assert "in.tgt:3: 21 positions > the model's limit of 16" in caplog.text
    assert "in.src and in.tgt:4: 21 positions" in caplog.text


def test_extract_help_lists_every_kinds_methods_in_registry_order():
    from aligner.cli.extract import METHODS_HELP
    from aligner.models import METHODS_BY_KIND

    listed = dict(part.split(": ") for part in METHODS_HELP.split("; "))
    assert {kind: tuple(methods.split(", ")) for kind, methods in listed.items()} == \
        METHODS_BY_KIND


def test_soft_average_with_soft_output_computes_the_matrices_once(tmp_path, monkeypatch):
    """--soft with -H soft-average: one soft pass per direction (the written matrices are the
    ones combined), and the same links as without --soft."""
    from click.testing import CliRunner

    from aligner.cli import main as cli
    from aligner.extract import inference

    passes = []
    soft_alignments = inference.soft_alignments

    def counted(model, pairs, direction, *args, **kwargs):
        passes.append((direction, len(pairs)))
        return soft_alignments(model, pairs, direction, *args, **kwargs)

    monkeypatch.setattr(inference, "soft_alignments", counted)

    directory, sources, targets = make_model_dir(tmp_path)
    (tmp_path / "in.src").write_text("\n".join(" ".join(s) for s in sources[:5]) + "\n")
    (tmp_path / "in.tgt").write_text("\n".join(" ".join(t) for t in targets[:5]) + "\n")
    args = ["extract", str(directory), "-s", str(tmp_path / "in.src"), "-t",
            str(tmp_path / "in.tgt"), "-H", "soft-average", "--threshold", "0.3"]
    with_soft = CliRunner().invoke(cli, args + ["-o", str(tmp_path / "a.txt"), "--soft",
                                                str(tmp_path / "a.npz")])
    assert with_soft.exit_code == 0, with_soft.output
    assert sorted(passes) == [("fwd", 5), ("rev", 5)]      # one pass of each direction
    plain = CliRunner().invoke(cli, args + ["-o", str(tmp_path / "b.txt"), "-q"])
    assert plain.exit_code == 0, plain.output
    assert (tmp_path / "a.txt").read_text() == (tmp_path / "b.txt").read_text()


def tiny_models_in_two_processes(monkeypatch):
    """Two seeded tiny hmm1 models (fwd, rev), with `parallel` allowed for any number of pairs
    on a machine that looks like two cores."""
    import os

    from aligner.extract import inference
    from aligner.models.direct_hmm import DirectHMMConfig, FirstOrderHMM

    monkeypatch.setattr(inference, "PARALLEL_MIN_PAIRS", 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    seed_everything(0)
    config = DirectHMMConfig(13, 13, d_model=16, n_heads=2, enc_layers=1, dec_layers=2,
                             d_ff=32, max_positions=16, lexicon_activation="linear")
    return {"fwd": FirstOrderHMM(config).eval(), "rev": FirstOrderHMM(config).eval()}


def recorded_process_contexts(monkeypatch):
    """The list that each multiprocessing context aligner.extract.inference asks for is appended to
    (its start method: "spawn" when the direction workers start)."""
    from aligner.extract import inference

    contexts = []
    get_context = inference.multiprocessing.get_context
    monkeypatch.setattr(inference.multiprocessing, "get_context",
                        lambda method: contexts.append(method) or get_context(method))
    return contexts


def test_soft_alignments_in_two_processes_equal_the_in_process_ones(monkeypatch):
    """parallel=True: each direction in its own spawn process; same matrices, input order,
    and a zero matrix for the pair that cannot be aligned."""
    from aligner.extract import inference

    models = tiny_models_in_two_processes(monkeypatch)
    generator = np.random.default_rng(0)
    pairs = [pair(generator.integers(4, 13, n).tolist(), generator.integers(4, 13, m).tolist())
             for n, m in [(3, 4), (5, 2), (1, 1), (6, 6), (2, 5)]] + [pair([], [5, 6])]
    contexts = recorded_process_contexts(monkeypatch)
    alone = inference.soft_alignments_by_direction(models, pairs, C.DIRECTIONS,
                                                   "hmm-posterior")
    assert contexts == []
    apart = inference.soft_alignments_by_direction(models, pairs, C.DIRECTIONS,
                                                   "hmm-posterior", parallel=True)
    assert contexts == ["spawn"]
    for direction in C.DIRECTIONS:
        assert len(apart[direction]) == len(pairs)
        for k, (a, b) in enumerate(zip(alone[direction], apart[direction])):
            assert a.shape == b.shape == (len(pairs[k].src_ids), len(pairs[k].tgt_ids))
            np.testing.assert_allclose(a, b, atol=1e-5)
        assert not apart[direction][-1].any()


def test_two_processes_keep_the_callers_cpu_autocast(monkeypatch):
    """Under bf16 CPU autocast (``--precision bf16``) the spawn workers run under it too: their
    matrices are the in-process bf16 ones, not the float32 ones a worker without autocast
    would give."""
    from aligner.extract import inference

    models = tiny_models_in_two_processes(monkeypatch)
    generator = np.random.default_rng(2)
    pairs = [pair(generator.integers(4, 13, n).tolist(), generator.integers(4, 13, m).tolist())
             for n, m in [(3, 4), (5, 2), (6, 6), (7, 5)]]
    fp32 = inference.soft_alignments_by_direction(models, pairs, C.DIRECTIONS,
                                                  "hmm-posterior")
    contexts = recorded_process_contexts(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        alone = inference.soft_alignments_by_direction(models, pairs, C.DIRECTIONS,
                                                       "hmm-posterior")
        apart = inference.soft_alignments_by_direction(models, pairs, C.DIRECTIONS,
                                                       "hmm-posterior", parallel=True)
    assert contexts == ["spawn"]                      # the workers ran
    for direction in C.DIRECTIONS:
        bf16_change = max(np.abs(a - b).max() for a, b in zip(alone[direction], fp32[direction]))
        worker_error = max(np.abs(a - b).max() for a, b in zip(alone[direction], apart[direction]))
        assert bf16_change > 1e-3, bf16_change        # bf16 changes the matrices visibly ...
        assert worker_error < bf16_change / 20, (worker_error, bf16_change)   # ... the workers'


def test_direction_workers_are_started_once_for_every_call_and_stopped_after(monkeypatch):
    """DirectionWorkers (align extract / align run: one pair for all blocks): the same two
    worker processes serve every call in the block, give the in-process matrices, and are
    gone when the block ends."""
    from aligner.extract import inference

    models = tiny_models_in_two_processes(monkeypatch)
    generator = np.random.default_rng(1)
    blocks = [[pair(generator.integers(4, 13, n).tolist(), generator.integers(4, 13, m).tolist())
               for n, m in sizes] for sizes in ([(3, 4), (5, 2)], [(1, 1), (6, 6), (2, 5)])]
    with inference.DirectionWorkers() as workers:
        processes = []
        for pairs in blocks:
            apart = inference.soft_alignments_by_direction(models, pairs, C.DIRECTIONS,
                                                           "hmm-posterior", parallel=workers)
            processes.append(sorted(p.pid for p in workers.pool()._pool))
            alone = inference.soft_alignments_by_direction(models, pairs, C.DIRECTIONS,
                                                           "hmm-posterior")
            for direction in C.DIRECTIONS:
                for a, b in zip(alone[direction], apart[direction]):
                    np.testing.assert_allclose(a, b, atol=1e-5)
        workers_of_block = list(workers.pool()._pool)
    assert len(processes[0]) == 2 and processes[0] == processes[1]
    assert not any(process.is_alive() for process in workers_of_block)
