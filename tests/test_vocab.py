"""Vocabulary: deterministic ids, specials first, encode/decode, JSON save/load."""
from __future__ import annotations

import json
import random

import pytest

from aligner import constants as C
from aligner.utils import AlignerError
from aligner.vocab import Vocabulary

SENTENCES = [["b", "a", "c@@", "c"], ["a", "d", "b"], ["a", "c"], ["e"]]
# counts: a 3, c 2, b 2, c@@ 1, d 1, e 1 -> frequency desc, then token string
EXPECTED = list(C.SPECIAL_TOKENS) + ["a", "b", "c", "c@@", "d", "e"]


def test_build_order_frequency_then_token():
    vocab = Vocabulary.build(SENTENCES)
    assert vocab.tokens == EXPECTED
    assert len(vocab) == 10
    assert [vocab.token_id(t) for t in C.SPECIAL_TOKENS] == [C.PAD_ID, C.BOS_ID, C.EOS_ID,
                                                              C.UNK_ID]
    assert vocab.token_id("a") == 4 and vocab.token_id("e") == 9


def test_build_is_independent_of_sentence_and_token_order():
    rng = random.Random(0)
    for _ in range(5):
        shuffled = [rng.sample(s, len(s)) for s in SENTENCES]
        rng.shuffle(shuffled)
        assert Vocabulary.build(shuffled) == Vocabulary.build(SENTENCES)


def test_min_count_and_max_size():
    assert Vocabulary.build(SENTENCES, min_count=2).tokens == list(C.SPECIAL_TOKENS) + \
        ["a", "b", "c"]
    assert Vocabulary.build(SENTENCES, max_size=6).tokens == list(C.SPECIAL_TOKENS) + ["a", "b"]
    assert Vocabulary.build(SENTENCES, max_size=4).tokens == list(C.SPECIAL_TOKENS)
    with pytest.raises(AlignerError):
        Vocabulary.build(SENTENCES, max_size=3)
    with pytest.raises(AlignerError):
        Vocabulary.build(SENTENCES, min_count=0)


def test_special_tokens_in_data_are_not_duplicated():
    vocab = Vocabulary.build([[C.UNK, "x", C.EOS, "x"]])
    assert vocab.tokens == list(C.SPECIAL_TOKENS) + ["x"]
    assert vocab.encode([C.UNK, "x"]) == [C.UNK_ID, 4]


def test_encode_decode():
    vocab = Vocabulary.build(SENTENCES)
    assert vocab.encode(["a", "zzz", "e", "c@@"]) == [4, C.UNK_ID, 9, 7]
    assert vocab.encode([]) == []
    assert vocab.decode([4, 9, C.EOS_ID]) == ["a", "e", C.EOS]
    assert vocab.decode(vocab.encode(["b", "d"])) == ["b", "d"]
    assert "a" in vocab and "zzz" not in vocab


def test_save_load_round_trip(tmp_path):
    vocab = Vocabulary.build(SENTENCES + [["été", "naïve", "\u00a0"]])
    path = str(tmp_path / C.VOCAB_SRC)
    vocab.save(path)
    loaded = Vocabulary.load(path)
    assert loaded == vocab and loaded.tokens == vocab.tokens
    assert "été" in (tmp_path / C.VOCAB_SRC).read_text(encoding="utf-8")  # readable UTF-8


def test_load_errors_name_the_file(tmp_path):
    path = tmp_path / "v.json"
    with pytest.raises(AlignerError, match="v.json: missing"):
        Vocabulary.load(str(path))
    path.write_text("[1, 2", encoding="utf-8")
    with pytest.raises(AlignerError, match="v.json: not a valid"):
        Vocabulary.load(str(path))
    path.write_text(json.dumps({"tokens": ["a"]}), encoding="utf-8")
    with pytest.raises(AlignerError, match="v.json: not a vocabulary"):
        Vocabulary.load(str(path))
    path.write_text(json.dumps({"format": "aligner-vocabulary", "tokens": ["a", "b"]}),
                    encoding="utf-8")
    with pytest.raises(AlignerError, match="v.json: a vocabulary must start"):
        Vocabulary.load(str(path))
    path.write_text(json.dumps({"format": "aligner-vocabulary",
                                "tokens": list(C.SPECIAL_TOKENS) + ["a", "a"]}),
                    encoding="utf-8")
    with pytest.raises(AlignerError, match="repeat"):
        Vocabulary.load(str(path))
