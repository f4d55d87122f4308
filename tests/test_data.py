"""Encoded corpora, token batching (determinism, resume, ranks), tensors, inference helpers."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from aligner import constants as C
from aligner.data import (CORPUS_META, LINE_NUMBERS, SRC_IDS, SRC_OFFSETS, EncodedCorpus,
                          TokenBatcher, encode_corpus, encode_pair, inference_batches,
                          make_batch, restore_order, subword_to_word_links)
from aligner.prep import Preprocessor, PrepConfig, split_words
from aligner.utils import AlignerError
from aligner.vocab import Vocabulary

# "abcd" -> "ab@@ cd", "abxcd" -> "ab@@ x@@ cd" (see tests/test_prep.py)
HAND_CODES = "#version: 0.2\na b\nc d</w>\n"


def hand_setup():
    """Six pairs; subword lengths (src, tgt) and what max_len=6, max_ratio=2.5 does to them:

    0: "abcd q" = ab@@ cd q (3) / q (1)        ratio 3 > 2.5: skipped (ratio)
    1: "" (0) / q (1)                          skipped (empty)
    2: q x 7 (7) / q (1)                       skipped (too long; checked before the ratio)
    3: ab@@ x@@ cd (3) / x y (2)               kept
    4: q (1) / "" (0)                          skipped (empty)
    5: ab@@ cd ab@@ cd (4) / q ab@@ cd (3)     kept
    """
    pre = Preprocessor(PrepConfig(bpe_merges=2), HAND_CODES, HAND_CODES)
    src = [s.split() for s in ["abcd q", "", "q q q q q q q", "abxcd", "q", "abcd abcd"]]
    tgt = [s.split() for s in ["q", "q", "q", "x y", "", "q abcd"]]
    src_vocab = Vocabulary.build(pre.segment(s, "src").subwords for s in src)
    tgt_vocab = Vocabulary.build(pre.segment(s, "tgt").subwords for s in tgt)
    return pre, src_vocab, tgt_vocab, src, tgt


# ---------------------------------------------------------------------------------------------
# encode_corpus / EncodedCorpus
# ---------------------------------------------------------------------------------------------

def test_encode_corpus_filters_counts_and_memmap_round_trip(tmp_path):
    pre, src_vocab, tgt_vocab, src, tgt = hand_setup()
    stats = encode_corpus(pre, src_vocab, tgt_vocab, src, tgt, str(tmp_path), max_len=6,
                          max_ratio=2.5)
    assert (stats.n_input, stats.n_kept, stats.n_empty, stats.n_too_long, stats.n_bad_ratio) \
        == (6, 2, 2, 1, 1)
    assert (stats.src_tokens, stats.tgt_tokens, stats.src_unk, stats.tgt_unk) == (7, 5, 0, 0)

    corpus = EncodedCorpus.open(str(tmp_path))
    assert len(corpus) == 2
    assert corpus.line_numbers.tolist() == [3, 5]
    assert corpus.src_lengths.tolist() == [3, 4] and corpus.tgt_lengths.tolist() == [2, 3]
    assert src_vocab.decode(corpus.source(0)) == ["ab@@", "x@@", "cd"]
    assert tgt_vocab.decode(corpus.target(0)) == ["x", "y"]
    assert src_vocab.decode(corpus.source(1)) == ["ab@@", "cd", "ab@@", "cd"]
    assert tgt_vocab.decode(corpus.target(1)) == ["q", "ab@@", "cd"]
    assert corpus.stats == stats
    # on disk: flat int32 ids, int64 offsets, read back memory-mapped
    assert isinstance(corpus.source(1), np.memmap) and corpus.source(1).dtype == np.int32
    assert np.load(tmp_path / SRC_IDS).tolist() == src_vocab.encode(
        ["ab@@", "x@@", "cd", "ab@@", "cd", "ab@@", "cd"])
    assert np.load(tmp_path / SRC_OFFSETS).tolist() == [0, 3, 7]
    assert np.load(tmp_path / SRC_OFFSETS).dtype == np.int64
    assert json.loads((tmp_path / CORPUS_META).read_text())["n_kept"] == 2
    # lines(start, stop): the same pairs, read a side at a time, as int64 arrays
    for start, stop in ((0, 2), (1, 2), (0, 1), (1, 1)):
        lines = corpus.lines(start, stop)
        assert len(lines) == stop - start
        for k, (source, target) in enumerate(lines, start):
            assert source.dtype == np.int64 and target.dtype == np.int64
            assert source.tolist() == corpus.source(k).tolist()
            assert target.tolist() == corpus.target(k).tolist()


def test_limits_can_be_disabled(tmp_path):
    pre, src_vocab, tgt_vocab, src, tgt = hand_setup()
    stats = encode_corpus(pre, src_vocab, tgt_vocab, src, tgt, str(tmp_path), max_len=None,
                          max_ratio=0)
    assert (stats.n_kept, stats.n_empty, stats.n_too_long, stats.n_bad_ratio) == (4, 2, 0, 0)
    assert EncodedCorpus.open(str(tmp_path)).line_numbers.tolist() == [0, 2, 3, 5]


def test_ratio_filter_alone(tmp_path):
    pre, src_vocab, tgt_vocab, src, tgt = hand_setup()
    stats = encode_corpus(pre, src_vocab, tgt_vocab, src, tgt, str(tmp_path), max_len=None,
                          max_ratio=3)  # ratio exactly 3 is kept, 7 is not
    assert (stats.n_kept, stats.n_empty, stats.n_too_long, stats.n_bad_ratio) == (3, 2, 0, 1)
    assert EncodedCorpus.open(str(tmp_path)).line_numbers.tolist() == [0, 3, 5]


def test_unknown_subwords_are_counted(tmp_path):
    pre, _, tgt_vocab, src, tgt = hand_setup()
    small = Vocabulary.build([["ab@@", "cd"]])  # no "x@@", no "q"
    stats = encode_corpus(pre, small, tgt_vocab, src, tgt, str(tmp_path), max_len=6,
                          max_ratio=2.5)
    assert stats.src_unk == 1  # x@@ of pair 3
    assert EncodedCorpus.open(str(tmp_path)).source(0).tolist() == [4, C.UNK_ID, 5]


def test_encode_corpus_accepts_iterators_and_checks_line_counts(tmp_path):
    pre, src_vocab, tgt_vocab, src, tgt = hand_setup()
    stats = encode_corpus(pre, src_vocab, tgt_vocab, iter(src), iter(tgt), str(tmp_path / "a"))
    assert stats.n_input == 6
    with pytest.raises(AlignerError, match="target side has fewer sentences"):
        encode_corpus(pre, src_vocab, tgt_vocab, src, tgt[:4], str(tmp_path / "b"))
    with pytest.raises(AlignerError, match="source side has fewer sentences"):
        encode_corpus(pre, src_vocab, tgt_vocab, src[:5], tgt, str(tmp_path / "c"))


def test_open_refuses_incomplete_directories(tmp_path):
    with pytest.raises(AlignerError, match=CORPUS_META):
        EncodedCorpus.open(str(tmp_path))
    pre, src_vocab, tgt_vocab, src, tgt = hand_setup()
    encode_corpus(pre, src_vocab, tgt_vocab, src, tgt, str(tmp_path))
    (tmp_path / LINE_NUMBERS).unlink()
    with pytest.raises(AlignerError, match=LINE_NUMBERS):
        EncodedCorpus.open(str(tmp_path))
    (tmp_path / CORPUS_META).write_text("{", encoding="utf-8")
    with pytest.raises(AlignerError, match=CORPUS_META + ": damaged"):
        EncodedCorpus.open(str(tmp_path))
    # rewriting a directory first removes its completeness marker
    with pytest.raises(AlignerError):
        encode_corpus(pre, src_vocab, tgt_vocab, src, tgt[:1], str(tmp_path))
    assert not (tmp_path / CORPUS_META).exists()


# ---------------------------------------------------------------------------------------------
# TokenBatcher
# ---------------------------------------------------------------------------------------------

def random_lengths(n=500, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 40, n), rng.integers(0, 40, n)


def padded_size(batch, src, tgt):
    return len(batch) * max(max(src[k], tgt[k]) + 1 for k in batch)


@pytest.mark.parametrize("shuffle", [True, False])
def test_every_pair_once_per_epoch_and_token_bound(shuffle):
    src, tgt = random_lengths()
    batcher = TokenBatcher(src, tgt, max_tokens=200, seed=3, shuffle=shuffle)
    n_batches = len(batcher)
    for epoch in range(3):
        batches = list(batcher)
        assert len(batches) == n_batches
        assert sorted(itertools.chain(*batches)) == list(range(len(src)))
        assert all(padded_size(b, src, tgt) <= 200 for b in batches)
        assert batcher.epoch == epoch + 1 and batcher.position == 0
    # batches are well filled (mean width ~27, so ~7 pairs fit in 200 tokens)
    assert n_batches < len(src) / 5


def test_batches_are_length_buckets():
    """Cut from the width-sorted order: batches, ordered by width, do not interleave."""
    src, tgt = random_lengths()
    widths = np.maximum(src, tgt) + 1
    batches = TokenBatcher(src, tgt, max_tokens=300, seed=1).epoch_batches(0)
    spans = sorted((widths[b].min(), widths[b].max()) for b in batches)
    assert all(hi <= next_lo for (_, hi), (next_lo, _) in zip(spans, spans[1:]))


def test_max_sentences_caps_batch_size():
    src, tgt = np.zeros(50, dtype=int), np.zeros(50, dtype=int)  # width 1 each
    batches = TokenBatcher(src, tgt, max_tokens=1000, max_sentences=8, seed=1).epoch_batches(0)
    assert sorted(len(b) for b in batches) == [2] + [8] * 6


def test_order_is_a_function_of_seed_and_epoch():
    src, tgt = random_lengths()
    a = TokenBatcher(src, tgt, max_tokens=200, seed=5)
    b = TokenBatcher(src, tgt, max_tokens=200, seed=5)
    c = TokenBatcher(src, tgt, max_tokens=200, seed=6)
    assert a.epoch_batches(0) == b.epoch_batches(0)
    assert a.epoch_batches(4) == b.epoch_batches(4)
    assert a.epoch_batches(0) != a.epoch_batches(1)
    assert a.epoch_batches(0) != c.epoch_batches(0)
    assert list(a) == b.epoch_batches(0)  # iteration hands out exactly epoch_batches
    unshuffled = TokenBatcher(src, tgt, max_tokens=200, shuffle=False)
    assert unshuffled.epoch_batches(0) == unshuffled.epoch_batches(7)


@pytest.mark.parametrize("stop_after", [0, 1, 7, "end"])
def test_resume_continues_with_the_same_batches(stop_after):
    src, tgt = random_lengths(300)
    first = TokenBatcher(src, tgt, max_tokens=150, seed=2)
    first.set_epoch(2)
    iterator = iter(first)
    n_taken = len(first) if stop_after == "end" else stop_after
    for _ in range(n_taken):
        next(iterator)
    state = json.loads(json.dumps(first.state_dict()))  # must survive a checkpoint file
    expected = list(itertools.islice(first.forever(), 2 * len(first)))

    resumed = TokenBatcher(src, tgt, max_tokens=150, seed=2)
    resumed.load_state_dict(state)
    assert list(itertools.islice(resumed.forever(), 2 * len(first))) == expected
    # and what was left is exactly the tail of the uninterrupted epoch
    uninterrupted = TokenBatcher(src, tgt, max_tokens=150, seed=2).epoch_batches(2)
    left = len(uninterrupted) - n_taken
    assert expected[:left] == uninterrupted[n_taken:]


def test_resume_refuses_changed_settings():
    src, tgt = random_lengths(100)
    state = TokenBatcher(src, tgt, max_tokens=150, seed=2).state_dict()
    with pytest.raises(AlignerError, match="max_tokens"):
        TokenBatcher(src, tgt, max_tokens=160, seed=2).load_state_dict(state)
    with pytest.raises(AlignerError, match="seed"):
        TokenBatcher(src, tgt, max_tokens=150, seed=3).load_state_dict(state)
    with pytest.raises(AlignerError, match="n_items"):
        TokenBatcher(src[:99], tgt[:99], max_tokens=150, seed=2).load_state_dict(state)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_partition_an_epoch_with_equal_batch_counts(world_size, shuffle):
    src, tgt = random_lengths(305)  # 79 batches per epoch: some are dropped for 2 and 3 ranks
    ranks = [TokenBatcher(src, tgt, max_tokens=120, seed=4, rank=r, world_size=world_size,
                          shuffle=shuffle) for r in range(world_size)]
    single = TokenBatcher(src, tgt, max_tokens=120, seed=4, shuffle=shuffle)
    for epoch in range(3):
        per_rank = [r.epoch_batches(epoch) for r in ranks]
        assert len({len(b) for b in per_rank}) == 1  # equal step counts
        assert len(per_rank[0]) == len(single.epoch_batches(epoch)) // world_size
        seen = [k for batches in per_rank for batch in batches for k in batch]
        assert len(seen) == len(set(seen))  # disjoint
        # the union is the single-process epoch minus its last (n_batches % world_size) batches
        all_batches = single.epoch_batches(epoch)
        n_dropped = len(all_batches) % world_size
        assert n_dropped > 0  # the case under test
        kept = all_batches[:len(all_batches) - n_dropped]
        assert sorted(seen) == sorted(k for batch in kept for k in batch)
        # step s of rank r is global batch s * world_size + r
        assert per_rank[1][0] == all_batches[1]


@pytest.mark.parametrize("world_size", [1, 3])
def test_every_rank_knows_every_ranks_batch_of_a_slot(world_size):
    """slot_batches: the batches ranks 0..N-1 take at one step, the same list on every rank
    (the trainer counts an update's tokens over all ranks from it, without a collective)."""
    src, tgt = random_lengths(305)
    ranks = [TokenBatcher(src, tgt, max_tokens=120, seed=4, rank=r, world_size=world_size)
             for r in range(world_size)]
    for epoch in range(2):
        for position in range(len(ranks[0])):
            slots = [r.slot_batches(epoch, position) for r in ranks]
            assert all(slot == slots[0] for slot in slots) and len(slots[0]) == world_size
            assert [r.epoch_batches(epoch)[position] for r in ranks] == slots[0]
    with pytest.raises(AlignerError, match="outside"):
        ranks[0].slot_batches(0, len(ranks[0]))


def test_too_small_budget_or_too_many_ranks_is_a_user_error():
    src, tgt = np.array([3, 9]), np.array([4, 2])
    with pytest.raises(AlignerError, match="smaller than the longest"):
        TokenBatcher(src, tgt, max_tokens=9)
    TokenBatcher(src, tgt, max_tokens=10)  # width 10 fits exactly
    with pytest.raises(AlignerError, match="ranks"):
        TokenBatcher(src, tgt, max_tokens=100, world_size=2, rank=1)  # one batch for two ranks
    with pytest.raises(AlignerError, match="no training pairs"):
        TokenBatcher([], [], max_tokens=100)


def test_from_corpus(tmp_path):
    pre, src_vocab, tgt_vocab, src, tgt = hand_setup()
    encode_corpus(pre, src_vocab, tgt_vocab, src, tgt, str(tmp_path), max_len=None, max_ratio=0)
    corpus = EncodedCorpus.open(str(tmp_path))
    batcher = TokenBatcher.from_corpus(corpus, max_tokens=8, seed=1)
    batches = list(batcher)
    assert sorted(itertools.chain(*batches)) == [0, 1, 2, 3]
    # widths 4, 8, 4, 5 (max_tokens 8): the two width-4 pairs share a batch, the others not
    assert sorted(map(sorted, batches)) == [[0, 2], [1], [3]]


# ---------------------------------------------------------------------------------------------
# make_batch
# ---------------------------------------------------------------------------------------------

SOURCE = [np.array([5, 6, 7], dtype=np.int32), np.array([8], dtype=np.int32)]
TARGET = [np.array([9], dtype=np.int32), np.array([10, 11], dtype=np.int32)]


def test_make_batch_fwd_by_hand():
    batch = make_batch(SOURCE, TARGET, "fwd")
    assert batch.src.tolist() == [[5, 6, 7, 2], [8, 2, 0, 0]]
    assert batch.tgt_in.tolist() == [[1, 9, 0], [1, 10, 11]]
    assert batch.tgt_out.tolist() == [[9, 2, 0], [10, 11, 2]]
    assert all(t.dtype == torch.long for t in (batch.src, batch.tgt_in, batch.tgt_out))
    assert batch.size == 2 and batch.n_tokens == 5


def test_make_batch_rev_swaps_the_languages():
    batch = make_batch(SOURCE, TARGET, "rev")
    assert batch.src.tolist() == [[9, 2, 0], [10, 11, 2]]
    assert batch.tgt_in.tolist() == [[1, 5, 6, 7], [1, 8, 0, 0]]
    assert batch.tgt_out.tolist() == [[5, 6, 7, 2], [8, 2, 0, 0]]
    assert batch.n_tokens == 6
    moved = batch.to("cpu")
    assert torch.equal(moved.tgt_out, batch.tgt_out)


def test_make_batch_empty_sequences_and_bad_arguments():
    batch = make_batch([np.array([], dtype=np.int32)], [np.array([4])], "fwd")
    assert batch.src.tolist() == [[C.EOS_ID]]
    assert batch.tgt_in.tolist() == [[C.BOS_ID, 4]] and batch.tgt_out.tolist() == [[4, C.EOS_ID]]
    with pytest.raises(ValueError):
        make_batch(SOURCE, TARGET, "backward")
    with pytest.raises(ValueError):
        make_batch(SOURCE, TARGET[:1], "fwd")


# ---------------------------------------------------------------------------------------------
# Inference helpers
# ---------------------------------------------------------------------------------------------

def test_inference_batches_by_hand_and_restore_order():
    lengths = [3, 10, 5, 5, 1, 30]
    batches = inference_batches(6, lengths, max_tokens=12)
    # longest first; 30 > 12 is never dropped but alone; then 12 // 10 = 1, 12 // 5 = 2, 12 // 3 = 4
    assert batches == [[5], [1], [2, 3], [0, 4]]
    results = [[f"r{k}" for k in batch] for batch in batches]
    assert restore_order(batches, results) == [f"r{k}" for k in range(6)]


def test_inference_batches_random_cover_and_bound():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 60, 200)
    batches = inference_batches(200, lengths, max_tokens=256)
    assert sorted(itertools.chain(*batches)) == list(range(200))
    assert all(len(b) * max(lengths[b]) <= 256 for b in batches)
    with pytest.raises(ValueError):
        inference_batches(3, [1, 2], 10)
    assert inference_batches(0, [], 10) == []


def test_restore_order_checks_its_input():
    with pytest.raises(ValueError):
        restore_order([[0, 1]], [["a"]])
    with pytest.raises(ValueError):
        restore_order([[0], [0]], [["a"], ["b"]])
    with pytest.raises(ValueError):
        restore_order([[0]], [])


def test_encode_pair_keeps_word_maps():
    pre, src_vocab, tgt_vocab, _, _ = hand_setup()
    pair = encode_pair(pre, src_vocab, tgt_vocab, ["abxcd", "q", "zz"], ["abcd"])
    assert src_vocab.decode(pair.src_ids) == ["ab@@", "x@@", "cd", "q", C.UNK, C.UNK]  # z@@ z
    assert pair.src_word_index == [0, 0, 0, 1, 2, 2]
    assert tgt_vocab.decode(pair.tgt_ids) == ["ab@@", "cd"] and pair.tgt_word_index == [0, 0]
    assert pair.width == 7
    empty = encode_pair(pre, src_vocab, tgt_vocab, [], ["q"])
    assert empty.src_ids.tolist() == [] and empty.width == 2


def test_subword_to_word_links_by_hand():
    # source "abxcd q abcd" = ab@@ x@@ cd | q | ab@@ cd ; target "x abcd" = x | ab@@ cd
    src_index, tgt_index = [0, 0, 0, 1, 2, 2], [0, 1, 1]
    links = [(1, 0), (2, 0), (4, 2), (5, 1), (3, 0), (5, 2)]
    assert subword_to_word_links(links, src_index, tgt_index) == {(0, 0), (2, 1), (1, 0)}
    assert subword_to_word_links([], src_index, tgt_index) == set()
    with pytest.raises(ValueError):  # position 6 would be the source EOS
        subword_to_word_links([(6, 0)], src_index, tgt_index)
    with pytest.raises(ValueError):
        subword_to_word_links([(0, 3)], src_index, tgt_index)


# ---------------------------------------------------------------------------------------------
# Real data
# ---------------------------------------------------------------------------------------------

def test_real_enfr_dev_pipeline(shared_data, tmp_path):
    """Hansards dev: BPE, vocab, encoded corpus and one epoch of batches, all consistent."""
    def read(name):
        with open(shared_data / "enfr" / name, encoding="utf-8") as handle:
            return [split_words(line) for line in handle]
    src, tgt = read("dev.src"), read("dev.tgt")
    pre = Preprocessor.learn(PrepConfig(bpe_merges=300), src, tgt)
    src_vocab = Vocabulary.build(pre.segment(s, "src").subwords for s in src)
    tgt_vocab = Vocabulary.build(pre.segment(s, "tgt").subwords for s in tgt)
    stats = encode_corpus(pre, src_vocab, tgt_vocab, src, tgt, str(tmp_path), max_len=80)
    assert stats.n_input == len(src) == 200
    assert stats.n_kept + stats.n_empty + stats.n_too_long + stats.n_bad_ratio == 200
    assert stats.src_unk == stats.tgt_unk == 0
    corpus = EncodedCorpus.open(str(tmp_path))
    for k in range(len(corpus)):
        line = int(corpus.line_numbers[k])
        subwords = src_vocab.decode(corpus.source(k))
        assert " ".join(subwords).replace("@@ ", "") == " ".join(src[line])
        assert tgt_vocab.decode(corpus.target(k)) == pre.segment(tgt[line], "tgt").subwords
    batches = list(TokenBatcher.from_corpus(corpus, max_tokens=400, seed=1))
    assert sorted(itertools.chain(*batches)) == list(range(len(corpus)))


@pytest.mark.parametrize("values", [np.arange(300_000, dtype=np.int64),
                                    np.frombuffer(b"", dtype=np.int64),
                                    np.arange(7, dtype=np.int32)])
def test_save_array_writes_what_np_save_writes(tmp_path, values):
    """The corpus arrays' writer (a header, then the data in chunks, atomically): the bytes of
    np.save, an empty array included (a round whose guide has no link writes one)."""
    from aligner.data import save_array

    save_array(str(tmp_path / "a.npy"), values)
    np.save(str(tmp_path / "b.npy"), values)
    assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "b.npy").read_bytes()
