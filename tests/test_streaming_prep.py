"""Training data read from the files at every pass: the same corpus as from memory, the same
errors, and memory that does not grow with the corpus (BitextFiles, iter_lines, the
preparation's two passes)."""
from __future__ import annotations

import hashlib
import os
import tracemalloc
from collections import Counter

import numpy as np
import pytest

from aligner.config import DataConfig
from aligner.formats import BitextFiles, iter_lines, open_bitext, read_bitext, read_lines
from aligner.prep import Preprocessor, PrepConfig
from aligner.training.corpus import prepare_data, bitext_fingerprint
from aligner.utils import AlignerError
from aligner.vocab import Vocabulary

from conftest import SAMPLE

# byte contents and what read_lines makes of them (None: an error)
CONTENTS = [b"a b\nc\n", b"a b\nc", b"\n", b"\n\n", b"x\r\ny\r\n", b"\xef\xbb\xbfhi\nyo",
            b"a\xa0b \tc\n", b"caf\xc3\xa9\n\xe2\x80\xa8z\n", b"", b"\xef\xbb\xbf",
            b"ok\nbad \xff\n", b"\xef\xbb\xbf\n"]


@pytest.mark.parametrize("content", CONTENTS)
def test_iter_lines_gives_what_read_lines_gives(tmp_path, content):
    path = str(tmp_path / "f.txt")
    with open(path, "wb") as handle:
        handle.write(content)
    try:
        expected = read_lines(path)
    except AlignerError as error:
        with pytest.raises(AlignerError) as streamed:
            list(iter_lines(path))
        assert str(streamed.value) == str(error)
        return
    assert list(iter_lines(path)) == expected


def _write(path, lines):
    with open(path, "w", encoding="utf-8", newline="") as handle:
        handle.write("".join(line + "\n" for line in lines))
    return str(path)


def test_bitext_files_iterate_like_read_bitext(tmp_path):
    src = _write(tmp_path / "s", ["a b", "", "c\u00a0d e"])
    tgt = _write(tmp_path / "t", ["x", "y z", ""])
    joint = _write(tmp_path / "j", ["a b ||| x", " ||| y z", "c\u00a0d e |||"])
    for files, memory in ((BitextFiles(src, tgt), read_bitext(src, tgt)),
                          (BitextFiles(joint=joint), read_bitext(joint=joint))):
        assert list(files) == list(memory) == list(zip(memory.source, memory.target))
        assert list(files.source) == memory.source and list(files.target) == memory.target
        assert list(files) == list(files)  # every pass reads the files again
        assert len(files) == 3 and (files.source_name, files.target_name) == (
            memory.source_name, memory.target_name)
        assert bitext_fingerprint(files) == bitext_fingerprint(memory)


def test_pairs_at_gives_the_lines_asked_for_and_splits_only_them(tmp_path, monkeypatch):
    """pairs_at (a round's sample, aligner/training/samples.py) gives the pairs a full pass gives
    at those lines, for files, a joint file and a bitext in memory; of the files it splits only
    the lines asked for into words, and it stops after the last one."""
    from aligner import formats

    sources = [f"s{k} " * (k % 3) for k in range(12)]
    targets = [f"t{k} u" for k in range(12)]
    src, tgt = _write(tmp_path / "s", sources), _write(tmp_path / "t", targets)
    joint = _write(tmp_path / "j", [f"{s}||| {t}" for s, t in zip(sources, targets)])
    lines = [0, 4, 5, 11]
    for bitext in (BitextFiles(src, tgt), BitextFiles(joint=joint), read_bitext(src, tgt)):
        every = list(bitext)
        assert list(bitext.pairs_at(lines)) == [every[k] for k in lines]
        assert list(bitext.pairs_at([])) == []
    split = []
    monkeypatch.setattr(formats, "tokenize_line",
                        lambda line: split.append(line) or line.split())
    assert len(list(BitextFiles(src, tgt).pairs_at([3, 7]))) == 2
    assert split == [sources[3], targets[3], sources[7], targets[7]]
    # a bad line before a line asked for is the error a full pass gives; one after it is
    # never read
    bad = tmp_path / "bad"
    bad.write_bytes(b"x\n\xffy\nz\n")
    with pytest.raises(AlignerError, match=r"bad:2: not valid UTF-8"):
        list(BitextFiles(_write(tmp_path / "s3", ["a", "b", "c"]), str(bad)).pairs_at([2]))
    assert list(BitextFiles(_write(tmp_path / "s3", ["a", "b", "c"]), str(bad)).pairs_at([0])) \
        == [(["a"], ["x"])]
    for lines, message in (([3, 3], "must increase"), ([5, 2], "must increase"),
                           ([-1], "must increase"), ([4, 12], "line 12 is past the end")):
        with pytest.raises(ValueError, match=message):
            list(BitextFiles(src, tgt).pairs_at(lines))


@pytest.mark.parametrize("src_lines, tgt_lines", [(["a", "b", "c"], ["x"]),
                                                  (["a"], ["x", "y", "z", "w"])])
def test_bitext_files_refuse_different_line_counts_as_read_bitext(tmp_path, src_lines,
                                                                  tgt_lines):
    src, tgt = _write(tmp_path / "s", src_lines), _write(tmp_path / "t", tgt_lines)
    with pytest.raises(AlignerError) as memory:
        read_bitext(src, tgt)
    with pytest.raises(AlignerError) as streamed:
        open_bitext(src, tgt)
    assert str(streamed.value) == str(memory.value)
    assert f"{src} has {len(src_lines)} lines, {tgt} has {len(tgt_lines)}" in str(memory.value)


def test_pipes_are_read_once_into_memory(tmp_path):
    """bash's <(...) and FIFOs can be read only once: open_bitext reads them into memory."""
    import threading

    src, fifo = _write(tmp_path / "s", ["a b", "c"]), str(tmp_path / "fifo")
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: _write(fifo, ["x", "y z"]))
    writer.start()
    bitext = open_bitext(src, fifo)
    writer.join()
    assert list(bitext) == [(["a", "b"], ["x"]), (["c"], ["y", "z"])]
    assert list(bitext) == list(bitext) and not isinstance(bitext, BitextFiles)


def test_bitext_files_name_the_bad_line(tmp_path):
    src = _write(tmp_path / "s", ["a", "b"])
    bad = tmp_path / "t"
    bad.write_bytes(b"x\n\xffy\n")
    with pytest.raises(AlignerError, match=r"t:2: not valid UTF-8"):
        open_bitext(src, str(bad))
    joint = _write(tmp_path / "j", ["a ||| x", "b x"])
    with pytest.raises(AlignerError, match=r"j:2: missing '\|\|\|'"):
        open_bitext(joint=joint)


def test_vocabulary_and_subword_counts_equal_counting_the_segmented_text():
    src = read_bitext(str(SAMPLE / "train.en"), str(SAMPLE / "train.fr")).source[:300]
    pre = Preprocessor.learn(PrepConfig(bpe_merges=200), src, src)
    segmented = [pre.segment(words, "src").subwords for words in src]
    words = Counter(word for sentence in src for word in sentence)
    assert pre.subword_counts(words, "src") == Counter(s for sent in segmented for s in sent)
    assert Vocabulary.from_counts(pre.subword_counts(words, "src")) == Vocabulary.build(segmented)


def _prepared(tmp_path, name, bitext, prep_config, guide=""):
    model_dir = str(tmp_path / name)
    os.makedirs(model_dir)
    pre, src_vocab, tgt_vocab = prepare_data(model_dir, bitext, prep_config,
                                              DataConfig(max_len=12, guide=guide), seed=3)
    corpus = {name: np.load(os.path.join(model_dir, "corpus", name))
              for name in sorted(os.listdir(os.path.join(model_dir, "corpus")))
              if name.endswith(".npy")}
    with open(os.path.join(model_dir, "corpus", "inputs.json")) as handle:
        inputs = handle.read()
    return pre.codes("src"), pre.codes("tgt"), src_vocab, tgt_vocab, corpus, inputs


@pytest.mark.parametrize("prep_config", [
    PrepConfig(bpe_merges=300),
    PrepConfig(bpe_merges=300, joint_bpe=False, lowercase=True),
    PrepConfig(bpe_merges=300, bpe_sample_sentences=100),
    PrepConfig(bpe_merges=0, tokenize=True)])
def test_prepared_from_files_equals_prepared_from_memory(tmp_path, prep_config):
    """Codes, vocabularies, every corpus array, the guide and the recorded fingerprint."""
    lines = read_lines(str(SAMPLE / "train.en"))[:400]
    targets = read_lines(str(SAMPLE / "train.fr"))[:400]
    lines[5], targets[9] = "", ""   # empty sides are skipped the same way
    src, tgt = _write(tmp_path / "s", lines), _write(tmp_path / "t", targets)
    guide = _write(tmp_path / "g", [" ".join(f"{k}-{k}" for k in range(min(len(a.split()),
                                                                            len(b.split()))))
                                    for a, b in zip(lines, targets)])
    streamed = _prepared(tmp_path, "files", open_bitext(src, tgt), prep_config, guide)
    in_memory = _prepared(tmp_path, "memory", read_bitext(src, tgt), prep_config, guide)
    assert streamed[:4] == in_memory[:4]
    assert streamed[4].keys() == in_memory[4].keys() and "guide.links.npy" in streamed[4]
    for name in streamed[4]:
        assert np.array_equal(streamed[4][name], in_memory[4][name]), name
    assert streamed[5] == in_memory[5]
    digest = hashlib.sha256()
    for a, b in zip(lines, targets):
        digest.update(f"{' '.join(a.split())}\t{' '.join(b.split())}\n".encode())
    assert digest.hexdigest() in streamed[5]


def _peak_preparation_bytes(tmp_path, name, n_lines, in_memory):
    """(tracemalloc's peak while a bitext of `n_lines` random sentences over a fixed set of
    200 words is opened and prepared, the bytes of the encoded corpus's arrays); the in-memory
    path reads the bitext with read_bitext."""
    rng = np.random.default_rng(0)
    words = [f"w{k}x" for k in range(200)]
    lines = [" ".join(rng.choice(words, size=30)) for _ in range(n_lines)]
    src, tgt = _write(tmp_path / f"{name}.s", lines), _write(tmp_path / f"{name}.t", lines)
    model_dir = str(tmp_path / name)
    os.makedirs(model_dir)
    tracemalloc.start()
    try:
        bitext = read_bitext(src, tgt) if in_memory else open_bitext(src, tgt)
        prepare_data(model_dir, bitext, PrepConfig(bpe_merges=50), DataConfig(), seed=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    corpus_dir = os.path.join(model_dir, "corpus")
    arrays = sum(np.load(os.path.join(corpus_dir, name)).nbytes
                 for name in os.listdir(corpus_dir) if name.endswith(".npy"))
    return peak, arrays


def test_preparation_memory_does_not_grow_with_the_corpus(tmp_path):
    """10x the lines: the streamed preparation's peak grows by about the encoded corpus's
    arrays (the ids, held until they are saved), while reading the bitext into memory grows
    by its words, several times more."""
    small, small_arrays = _peak_preparation_bytes(tmp_path, "small", 1000, in_memory=False)
    large, large_arrays = _peak_preparation_bytes(tmp_path, "large", 10000, in_memory=False)
    large_in_memory, _ = _peak_preparation_bytes(tmp_path, "memory", 10000, in_memory=True)
    growth = large_arrays - small_arrays
    assert large - small < 1.5 * growth, (small, large, growth)
    assert large_in_memory - large > 3 * growth, (large, large_in_memory, growth)
