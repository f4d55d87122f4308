"""Preprocessing: tokenization, BPE learning/applying, word indices, saving and loading."""
from __future__ import annotations

import os

import pytest

from aligner import constants as C
from aligner.formats import tokenize_line
from aligner.prep import PREP_CONFIG_NAME, Preprocessor, PrepConfig, Segmented, split_words
from aligner.utils import AlignerError

# Hand-written codes (subword-nmt format 0.2: "</w>" marks a word-final unit).
# "abcd" -> a b c d</w> -> (a b) -> ab c d</w> -> (c d</w>) -> ab cd</w>  => "ab@@ cd"
# "abxcd" -> ab x cd                                                       => "ab@@ x@@ cd"
HAND_CODES = "#version: 0.2\na b\nc d</w>\n"

# A small corpus with repeated words, so that BPE has something to merge.
SRC = [s.split() for s in [
    "the lower house sat today", "the newest houses are lower", "the widest house is newer",
    "lower the newest flag", "houses and lowest houses", "the house sat on the lowest floor",
]]
TGT = [s.split() for s in [
    "la chambre basse a siégé", "les maisons neuves sont basses", "la maison la plus large",
    "baissez le drapeau neuf", "maisons et maisons basses", "la chambre a siégé au rez",
]]


def joined(segmented: Segmented) -> str:
    """subword-nmt's own way back to words: remove "@@ "."""
    return " ".join(segmented.subwords).replace(C.BPE_SEPARATOR + " ", "")


def hand_preprocessor() -> Preprocessor:
    return Preprocessor(PrepConfig(bpe_merges=2), HAND_CODES, HAND_CODES)


def test_word_index_hand_made_three_pieces():
    seg = hand_preprocessor().segment(["abxcd", "q", "abcd", "cd"], "src")
    assert seg.subwords == ["ab@@", "x@@", "cd", "q", "ab@@", "cd", "cd"]
    assert seg.word_index == [0, 0, 0, 1, 2, 2, 3]
    assert seg.words() == ["abxcd", "q", "abcd", "cd"]


def test_segment_empty_sentence_and_single_characters():
    pre = hand_preprocessor()
    assert pre.segment([], "tgt") == Segmented([], [])
    seg = pre.segment(["a", "b", "c"], "tgt")  # one-character words are never split
    assert seg.subwords == ["a", "b", "c"] and seg.word_index == [0, 1, 2]


def test_segment_rejects_empty_word_and_bad_side():
    pre = hand_preprocessor()
    with pytest.raises(ValueError):
        pre.segment(["ab", ""], "src")
    with pytest.raises(ValueError):
        pre.segment(["ab"], "source")


@pytest.mark.parametrize("joint", [True, False])
def test_bpe_round_trip_on_learned_codes(joint):
    pre = Preprocessor.learn(PrepConfig(bpe_merges=40, joint_bpe=joint), SRC, TGT)
    n_split = 0
    for side, sentences in (("src", SRC), ("tgt", TGT)):
        for words in sentences + [["unseenwordxyz", "h", "lowerhouses"]]:
            seg = pre.segment(words, side)
            assert joined(seg) == " ".join(words)
            assert seg.words() == list(words)
            assert len(seg.word_index) == len(seg.subwords)
            assert seg.word_index == sorted(seg.word_index)
            assert set(seg.word_index) == set(range(len(words)))
            # each word's pieces: all but the last carry "@@", and they spell the word
            for i, word in enumerate(words):
                pieces = [p for p, w in zip(seg.subwords, seg.word_index) if w == i]
                assert all(p.endswith("@@") for p in pieces[:-1])
                assert "".join(p[:-2] for p in pieces[:-1]) + pieces[-1] == word
                n_split += len(pieces) > 1
    assert n_split > 0  # the test must exercise split words


def test_merge_count_and_min_frequency():
    pre = Preprocessor.learn(PrepConfig(bpe_merges=5), SRC, TGT)
    merges = pre.codes("src").split("\n")[1:]
    assert pre.codes("src").startswith("#version: 0.2\n")
    assert len([m for m in merges if m]) == 5
    # min_frequency above every pair count: no merge at all, words stay whole (in characters)
    pre = Preprocessor.learn(PrepConfig(bpe_merges=50, bpe_min_frequency=1000), SRC, TGT)
    assert pre.codes("src") == "#version: 0.2\n"
    seg = pre.segment(["house"], "src")
    assert seg.subwords == ["h@@", "o@@", "u@@", "s@@", "e"]
    assert seg.word_index == [0] * 5


def test_learning_draws_no_progress_bar(capfd):
    """subword-nmt's own tqdm bar over the merges is silenced (it printed even under -q)."""
    pre = Preprocessor.learn(PrepConfig(bpe_merges=5), SRC, TGT)
    assert len([m for m in pre.codes("src").split("\n")[1:] if m]) == 5
    err = capfd.readouterr().err
    assert "%|" not in err and "it/s" not in err, err


def test_joint_versus_separate_codes():
    src = [["aaaa", "abab"]] * 3
    tgt = [["zzzz", "zyzy"]] * 3
    joint = Preprocessor.learn(PrepConfig(bpe_merges=10, joint_bpe=True), src, tgt)
    assert joint.codes("src") == joint.codes("tgt")
    joint_units = set(joint.codes("src").split())
    assert {"a", "z"} <= joint_units  # merges of both languages in one file
    separate = Preprocessor.learn(PrepConfig(bpe_merges=10, joint_bpe=False), src, tgt)
    src_units = set(separate.codes("src").split("\n", 1)[1].split())
    tgt_units = set(separate.codes("tgt").split("\n", 1)[1].split())
    assert all("z" not in u and "y" not in u for u in src_units)
    assert all("a" not in u and "b" not in u for u in tgt_units)
    # the source codes know nothing of target words: "zzzz" falls apart into characters
    assert separate.segment(["zzzz"], "src").subwords == ["z@@", "z@@", "z@@", "z"]
    assert separate.segment(["zzzz"], "tgt").subwords == ["zzzz"]
    assert joint.segment(["zzzz"], "src").subwords == ["zzzz"]


def test_learning_streams_generators():
    config = PrepConfig(bpe_merges=30)
    streamed = Preprocessor.learn(config, (s for s in SRC), (t for t in TGT))
    assert streamed.codes("tgt") == Preprocessor.learn(config, SRC, TGT).codes("tgt")


def test_sample_uses_only_the_sampled_pairs():
    src = [["aaaa"], ["bbbb"], ["cccc"], ["dddd"]]
    tgt = [["aaaa"], ["bbbb"], ["cccc"], ["dddd"]]
    config = PrepConfig(bpe_merges=10, bpe_sample_sentences=1, bpe_min_frequency=1)
    letters = set()
    for seed in range(20):
        codes = Preprocessor.learn(config, src, tgt, seed=seed).codes("src")
        used = {c for c in codes.split("\n", 1)[1] if c.isalpha() and c not in "w"}
        assert len(used) == 1  # merges of one word only
        letters |= used
    assert len(letters) > 1  # and the sample depends on the seed
    # a sample as large as the corpus is the corpus
    whole = PrepConfig(bpe_merges=10, bpe_sample_sentences=4, bpe_min_frequency=1)
    assert Preprocessor.learn(whole, src, tgt, seed=1).codes("src") == \
        Preprocessor.learn(PrepConfig(bpe_merges=10, bpe_min_frequency=1), src, tgt).codes("src")


def test_learning_is_deterministic_and_sampling_is_seeded():
    config = PrepConfig(bpe_merges=30)
    assert Preprocessor.learn(config, SRC, TGT).codes("src") == \
        Preprocessor.learn(config, SRC, TGT).codes("src")
    sampled = PrepConfig(bpe_merges=30, bpe_sample_sentences=2)
    a = Preprocessor.learn(sampled, SRC, TGT, seed=3).codes("src")
    assert a == Preprocessor.learn(sampled, SRC, TGT, seed=3).codes("src")
    assert a != Preprocessor.learn(config, SRC, TGT).codes("src")


def test_learn_rejects_bad_input():
    with pytest.raises(AlignerError, match="target side has fewer sentences"):
        Preprocessor.learn(PrepConfig(), SRC, TGT[:-1])
    with pytest.raises(AlignerError, match="source side has fewer sentences"):
        Preprocessor.learn(PrepConfig(bpe_merges=0), iter(SRC[:2]), iter(TGT))
    with pytest.raises(AlignerError, match="no words"):
        Preprocessor.learn(PrepConfig(), [[]], [[]])
    with pytest.raises(AlignerError, match="without spaces"):
        Preprocessor.learn(PrepConfig(), [["a b"]], [["c"]])


def test_no_bpe_keeps_words(tmp_path):
    pre = Preprocessor.learn(PrepConfig(bpe_merges=0), SRC, TGT)
    seg = pre.segment(["lowest", "houses"], "src")
    assert seg.subwords == ["lowest", "houses"] and seg.word_index == [0, 1]
    pre.save(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [PREP_CONFIG_NAME]
    assert Preprocessor.load(str(tmp_path)).segment(["lowest"], "tgt").subwords == ["lowest"]


@pytest.mark.parametrize("joint", [True, False])
def test_save_load_round_trip(tmp_path, joint):
    config = PrepConfig(bpe_merges=25, joint_bpe=joint, lowercase=True, tokenize=True,
                        src_lang="de", tgt_lang="en")
    pre = Preprocessor.learn(config, SRC, TGT)
    pre.save(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted([PREP_CONFIG_NAME, C.BPE_CODES_SRC,
                                                   C.BPE_CODES_TGT])
    for name in (C.BPE_CODES_SRC, C.BPE_CODES_TGT):
        assert (tmp_path / name).read_text(encoding="utf-8").startswith("#version: 0.2\n")
    loaded = Preprocessor.load(str(tmp_path))
    assert loaded.config == config
    for side, sentences in (("src", SRC), ("tgt", TGT)):
        assert loaded.codes(side) == pre.codes(side)
        for words in sentences:
            assert loaded.segment(words, side) == pre.segment(words, side)


def test_load_reports_missing_and_damaged_files(tmp_path):
    with pytest.raises(AlignerError, match=PREP_CONFIG_NAME):
        Preprocessor.load(str(tmp_path))
    Preprocessor.learn(PrepConfig(bpe_merges=5), SRC, TGT).save(str(tmp_path))
    (tmp_path / C.BPE_CODES_TGT).unlink()
    with pytest.raises(AlignerError, match=C.BPE_CODES_TGT + ": missing"):
        Preprocessor.load(str(tmp_path))
    (tmp_path / C.BPE_CODES_TGT).write_text("#version: 0.2\na b\nabc\n", encoding="utf-8")
    with pytest.raises(AlignerError, match=C.BPE_CODES_TGT + ":3:"):
        Preprocessor.load(str(tmp_path))
    (tmp_path / C.BPE_CODES_TGT).write_text("#version: 0.2\na b\n\nc d\n", encoding="utf-8")
    with pytest.raises(AlignerError, match=C.BPE_CODES_TGT + ":3:"):  # subword-nmt would exit
        Preprocessor.load(str(tmp_path))
    (tmp_path / C.BPE_CODES_TGT).write_text("a b\n", encoding="utf-8")
    with pytest.raises(AlignerError, match="version"):
        Preprocessor.load(str(tmp_path))
    (tmp_path / PREP_CONFIG_NAME).write_text('{"bpe_merges": 5, "colour": 1}', encoding="utf-8")
    with pytest.raises(AlignerError, match="colour"):
        Preprocessor.load(str(tmp_path))
    (tmp_path / PREP_CONFIG_NAME).write_text("{not json", encoding="utf-8")
    with pytest.raises(AlignerError, match=PREP_CONFIG_NAME):
        Preprocessor.load(str(tmp_path))


def test_config_dict_round_trip():
    config = PrepConfig(tokenize=True, src_lang="ro", bpe_merges=123, joint_bpe=False,
                        bpe_sample_sentences=7)
    assert PrepConfig.from_dict(config.to_dict()) == config
    assert PrepConfig.from_dict({}) == PrepConfig()


def test_tokenize_off_splits_on_ascii_whitespace_only():
    pre = Preprocessor(PrepConfig(bpe_merges=0))
    # pre-tokenized input is kept as is: "&" and "don't" untouched, NBSP stays inside its token
    assert pre.tokenize_line("  Tom &  don't\tgo.\u00a0x \n", "src") == \
        ["Tom", "&", "don't", "go.\u00a0x"]
    assert split_words("") == [] and split_words(" \t ") == []
    assert split_words("a b\r\n") == ["a", "b"]


@pytest.mark.parametrize("line", ["a  b\tc", " x\u00a0y \u2009z ", "p\vq\fr", "\u3000"])
def test_split_words_agrees_with_formats(line):
    assert split_words(line) == tokenize_line(line)
    assert Preprocessor(PrepConfig(bpe_merges=0)).tokenize_line(line, "src") == tokenize_line(line)


def test_tokenize_with_sacremoses_no_escaping():
    pre = Preprocessor(PrepConfig(tokenize=True, src_lang="en", tgt_lang="fr", bpe_merges=0))
    assert pre.tokenize_line("Tom & Jerry's cat, e-mail <b>.", "src") == \
        ["Tom", "&", "Jerry", "'s", "cat", ",", "e-mail", "<", "b", ">", "."]
    # French rules for the target side: elision stays on the left token
    assert pre.tokenize_line("l'homme n'est-ce pas?", "tgt") == \
        ["l'", "homme", "n'", "est-ce", "pas", "?"]


def test_lowercase_after_tokenization():
    pre = Preprocessor(PrepConfig(tokenize=True, lowercase=True, bpe_merges=0))
    assert pre.tokenize_line("The House's ÉTÉ.", "src") == ["the", "house", "'s", "été", "."]
    plain = Preprocessor(PrepConfig(lowercase=True, bpe_merges=0))
    assert plain.tokenize_line("The House's", "tgt") == ["the", "house's"]


def test_real_enfr_round_trip(shared_data):
    """On real Hansards text every sentence comes back word for word from its subwords."""
    def read(name):
        with open(shared_data / "enfr" / name, encoding="utf-8") as handle:
            return [split_words(line) for line in handle]
    src, tgt = read("dev.src"), read("dev.tgt")
    pre = Preprocessor.learn(PrepConfig(bpe_merges=500), src, tgt)
    for side, sentences in (("src", src), ("tgt", tgt)):
        for words in sentences:
            seg = pre.segment(words, side)
            assert seg.words() == words
            assert joined(seg) == " ".join(words)


def test_preprocessor_without_codes_tokenizes_but_cannot_segment():
    pre = Preprocessor(PrepConfig(bpe_merges=100))
    assert pre.tokenize_line("a b", "src") == ["a", "b"]
    with pytest.raises(RuntimeError, match="codes"):
        pre.segment(["a"], "src")


def test_saved_codes_work_with_subword_nmt_itself(tmp_path):
    """A user can apply the model directory's codes with subword-nmt and get the same units."""
    from subword_nmt.apply_bpe import BPE

    pre = Preprocessor.learn(PrepConfig(bpe_merges=40, joint_bpe=False), SRC, TGT)
    pre.save(str(tmp_path))
    for side, name, sentences in (("src", C.BPE_CODES_SRC, SRC), ("tgt", C.BPE_CODES_TGT, TGT)):
        with open(tmp_path / name, encoding="utf-8") as codes:
            reference = BPE(codes)
        for words in sentences:
            assert reference.segment(" ".join(words)).split() == pre.segment(words, side).subwords


def test_codes_without_merges_survive_save_and_load(tmp_path):
    pre = Preprocessor.learn(PrepConfig(bpe_merges=50, bpe_min_frequency=1000), SRC, TGT)
    pre.save(str(tmp_path))
    loaded = Preprocessor.load(str(tmp_path))
    assert loaded.segment(["abc"], "tgt").subwords == ["a@@", "b@@", "c"]


def test_paired_checks_equal_lengths():
    from aligner.prep import paired

    assert list(paired([1, 2], "ab")) == [(1, "a"), (2, "b")]
    with pytest.raises(AlignerError, match="ends before sentence 2"):
        list(paired([1], "ab"))


def test_words_rejects_an_inconsistent_segmentation():
    with pytest.raises(ValueError, match="lacks"):
        Segmented(["ab", "cd"], [0, 0]).words()


def test_words_containing_the_marker_map_back_through_word_index():
    """"@@" inside the data would fool a join on "@@ "; word_index keeps words exact."""
    pre = Preprocessor.learn(PrepConfig(bpe_merges=20), SRC + [["x@@", "@@", "a@@b"]] * 3,
                             TGT + [["@@"]] * 3)
    for words in (["x@@", "@@", "a@@b", "house"], ["@@"], ["lower@@", "x"]):
        seg = pre.segment(words, "src")
        assert seg.words() == words
        assert len(seg.subwords) == len(seg.word_index)
