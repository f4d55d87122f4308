"""From words to id tensors: encoded corpora on disk, batching for training and inference.

* :func:`encode_corpus` BPE-segments and encodes a training bitext once and writes it as
  memory-mapped numpy arrays; :class:`EncodedCorpus` reads them back without loading them.
* :class:`TokenBatcher` groups pair indices into length-bucketed batches bounded by a token
  budget, reproducibly per (seed, epoch), resumable, and sharded for DDP ranks.
* :func:`make_batch` turns id arrays into the tensors of ``aligner/models/base.py``.
* :func:`encode_pair`, :func:`inference_batches`, :func:`restore_order` and
  :func:`subword_to_word_links` serve extraction: batch by length, give results back in input
  order, and map subword links to word links.

Index conventions: pair k of an encoded corpus is the k-th *kept* pair; ``line_numbers[k]`` is
its 0-based position in the input (file line = line_numbers[k] + 1). Links are (source
position, target position), 0-based, in source-target orientation. numpy only; torch is
imported inside :func:`make_batch` and :meth:`Batch.to`.
"""
from __future__ import annotations

import json
import logging
import os
from array import array
from dataclasses import asdict, dataclass
from typing import (TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Optional, Sequence,
                    Set, Tuple, TypeVar)

import numpy as np

from aligner import constants as C
from aligner.config import dataclass_from_dict
from aligner.prep import Preprocessor, paired
from aligner.utils import AlignerError, atomic_output, check_condition, first_line
from aligner.vocab import Vocabulary

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

# Files of an encoded corpus directory. corpus.json is written last: its presence marks the
# directory complete.
CORPUS_META = "corpus.json"
SRC_IDS, SRC_OFFSETS = "src.ids.npy", "src.offsets.npy"
TGT_IDS, TGT_OFFSETS = "tgt.ids.npy", "tgt.offsets.npy"
LINE_NUMBERS = "line_numbers.npy"

DEFAULT_MAX_LEN = 250      # subwords per side, EOS not counted
DEFAULT_MAX_RATIO = 9.0    # longer side / shorter side, in subwords (Moses clean-corpus default)


# ---------------------------------------------------------------------------------------------
# Encoded corpus on disk
# ---------------------------------------------------------------------------------------------

@dataclass
class CorpusStats:
    """What :func:`encode_corpus` kept and skipped (every input pair is counted exactly once)."""

    n_input: int = 0
    n_kept: int = 0
    n_empty: int = 0        # a side without words
    n_too_long: int = 0     # a side with more than max_len subwords
    n_bad_ratio: int = 0    # subword length ratio above max_ratio
    src_tokens: int = 0     # subwords kept (EOS not counted)
    tgt_tokens: int = 0
    src_unk: int = 0        # kept subwords that became UNK
    tgt_unk: int = 0
    max_len: int = 0
    max_ratio: float = 0.0
    # vocabulary sizes the ids were encoded with (0 = not recorded: written by an older version)
    src_vocab_size: int = 0
    tgt_vocab_size: int = 0

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


#: bytes per write of :func:`save_array`
_WRITE_CHUNK = 1 << 20


def save_array(path: str, values: np.ndarray) -> None:
    """np.save `values` to `path` atomically (utils.atomic_output: no half-written array under
    the final name); a full disk or a file size limit is one AlignerError naming `path`.

    The .npy header, then the data in chunks of :data:`_WRITE_CHUNK` bytes of a memoryview
    (no copy of the array), each through Python's write, whose OSError says why (ENOSPC,
    EFBIG), where np.save to a real file writes with C's fwrite and says only '13609
    requested and 8160 written'. The same bytes as np.save."""
    values = np.ascontiguousarray(values)
    with atomic_output(path, "wb") as out:
        np.lib.format.write_array_header_1_0(out, np.lib.format.header_data_from_array_1_0(
            values))
        data = memoryview(values.reshape(-1).view(np.uint8))   # bytes, no copy
        for start in range(0, len(data), _WRITE_CHUNK):
            out.write(data[start:start + _WRITE_CHUNK])


#: the CorpusStats counter of each reason :func:`filtered_out` gives
_SKIP_COUNTERS = {"empty side": "n_empty", "too long": "n_too_long",
                  "length ratio": "n_bad_ratio"}


def filtered_out(src_len: int, tgt_len: int, max_len: Optional[int],
                 max_ratio: Optional[float]) -> Optional[str]:
    """Why training skips a pair of `src_len` / `tgt_len` subwords (no EOS) under the length
    filters `max_len` and `max_ratio` (None or 0: off): "empty side", "too long", "length
    ratio", or None when it is kept. The one test of :func:`encode_corpus`, and of the
    self-training guides, which leave the lines training skips unaligned."""
    if src_len == 0 or tgt_len == 0:
        return "empty side"
    if max_len and max(src_len, tgt_len) > max_len:
        return "too long"
    if max_ratio and max(src_len, tgt_len) > max_ratio * min(src_len, tgt_len):
        return "length ratio"
    return None


def encode_corpus(pre: Preprocessor, src_vocab: Vocabulary, tgt_vocab: Vocabulary,
                  source_sentences: Iterable[Sequence[str]],
                  target_sentences: Iterable[Sequence[str]], out_dir: str,
                  max_len: Optional[int] = DEFAULT_MAX_LEN,
                  max_ratio: Optional[float] = DEFAULT_MAX_RATIO) -> CorpusStats:
    """BPE-segment, encode and store a training bitext as memory-mappable arrays.

    `source_sentences` / `target_sentences`: line-aligned sentences as lists of words (the
    output of ``Preprocessor.tokenize_line``); they must have the same length. Pairs with an
    empty side, a side longer than `max_len` subwords, or a subword length ratio above
    `max_ratio` are skipped and counted (None or 0 disables a limit); the input position of
    every kept pair is stored. Writes into `out_dir` (created if needed):

    * ``src.ids.npy`` int32 (total source subwords,): all kept source sentences concatenated,
      no EOS; ``src.offsets.npy`` int64 (n_kept + 1,): sentence k is ids[offsets[k]:offsets[k+1]]
    * ``tgt.ids.npy``, ``tgt.offsets.npy``: the same for the target side
    * ``line_numbers.npy`` int64 (n_kept,): 0-based input position of kept pair k
    * ``corpus.json``: the returned :class:`CorpusStats` (with the vocabulary sizes, so that
      :meth:`EncodedCorpus.open` can check the ids), written last
    """
    check_condition(max_len is None or max_len >= 0, "max_len must be >= 0")
    check_condition(max_ratio is None or max_ratio >= 0, "max_ratio must be >= 0")
    os.makedirs(out_dir, exist_ok=True)
    meta_path = os.path.join(out_dir, CORPUS_META)
    if os.path.exists(meta_path):  # the directory is being rewritten: mark it incomplete first
        os.unlink(meta_path)
    stats = CorpusStats(max_len=max_len or 0, max_ratio=float(max_ratio or 0.0),
                        src_vocab_size=len(src_vocab), tgt_vocab_size=len(tgt_vocab))
    ids = {"src": array("i"), "tgt": array("i")}
    offsets = {"src": array("q", [0]), "tgt": array("q", [0])}
    kept_lines = array("q")
    for k, (src_words, tgt_words) in enumerate(paired(source_sentences, target_sentences)):
        stats.n_input += 1
        src_sub = pre.segment(src_words, "src").subwords   # (a word gives 1+ subwords)
        tgt_sub = pre.segment(tgt_words, "tgt").subwords
        why = filtered_out(len(src_sub), len(tgt_sub), max_len, max_ratio)
        if why is not None:
            counter = _SKIP_COUNTERS[why]
            setattr(stats, counter, getattr(stats, counter) + 1)
            continue
        for side, subwords, vocab in (("src", src_sub, src_vocab), ("tgt", tgt_sub, tgt_vocab)):
            encoded = vocab.encode(subwords)
            ids[side].extend(encoded)
            offsets[side].append(len(ids[side]))
        kept_lines.append(k)
    stats.n_kept = len(kept_lines)
    stats.src_tokens, stats.tgt_tokens = len(ids["src"]), len(ids["tgt"])
    # views of the arrays' buffers, not copies (the ids are the one thing that grows with the
    # corpus here)
    src_ids = np.frombuffer(ids["src"], dtype=np.int32)
    tgt_ids = np.frombuffer(ids["tgt"], dtype=np.int32)
    stats.src_unk = int(np.count_nonzero(src_ids == C.UNK_ID))
    stats.tgt_unk = int(np.count_nonzero(tgt_ids == C.UNK_ID))
    for name, values in ((SRC_IDS, src_ids), (TGT_IDS, tgt_ids),
                         (SRC_OFFSETS, np.frombuffer(offsets["src"], dtype=np.int64)),
                         (TGT_OFFSETS, np.frombuffer(offsets["tgt"], dtype=np.int64)),
                         (LINE_NUMBERS, np.frombuffer(kept_lines, dtype=np.int64))):
        save_array(os.path.join(out_dir, name), values)
    with atomic_output(meta_path) as out:  # last: marks the directory complete
        json.dump(stats.to_dict(), out, indent=2)
        out.write("\n")
    logger.info("encoded %d of %d sentence pairs (%d source / %d target subwords); skipped %d "
                "with an empty side, %d longer than %s subwords, %d with length ratio above %s",
                stats.n_kept, stats.n_input, stats.src_tokens, stats.tgt_tokens, stats.n_empty,
                stats.n_too_long, max_len or "any", stats.n_bad_ratio, max_ratio or "any")
    return stats


class EncodedCorpus:
    """A corpus written by :func:`encode_corpus`, memory-mapped (read-only).

    ``source(k)`` / ``target(k)``: int32 array of the subword ids of kept pair k (no EOS).
    ``src_lengths`` / ``tgt_lengths``: int64 (len,) subword counts; ``line_numbers``: int64
    (len,) 0-based input positions; ``stats``: the :class:`CorpusStats` of the encoding run.
    """

    def __init__(self, src_ids: np.ndarray, src_offsets: np.ndarray, tgt_ids: np.ndarray,
                 tgt_offsets: np.ndarray, line_numbers: np.ndarray,
                 stats: Optional[CorpusStats] = None):
        if not (len(src_offsets) == len(tgt_offsets) == len(line_numbers) + 1):
            raise ValueError("offsets and line numbers disagree on the number of pairs")
        self._src_ids, self._src_offsets = src_ids, src_offsets
        self._tgt_ids, self._tgt_offsets = tgt_ids, tgt_offsets
        self.line_numbers = line_numbers
        self.src_lengths = np.diff(src_offsets).astype(np.int64)
        self.tgt_lengths = np.diff(tgt_offsets).astype(np.int64)
        self.stats = stats
        self.directory: Optional[str] = None

    @classmethod
    def open(cls, directory: str) -> "EncodedCorpus":
        """Memory-map the arrays in `directory`, validated (dtypes, shapes, offsets, ids within
        the recorded vocabulary sizes); one AlignerError line naming the file if it is missing,
        incomplete or damaged (rebuilt by training again with ``--overwrite``)."""
        meta_path = os.path.join(directory, CORPUS_META)
        check_condition(os.path.isfile(meta_path),
                        f"{directory}: not a complete encoded corpus ({CORPUS_META} missing)")
        try:
            with open(meta_path, encoding="utf-8") as handle:
                values = json.load(handle)
            stats = dataclass_from_dict(CorpusStats, values)
        except (ValueError, AlignerError) as error:
            check_corpus_file(False, meta_path, first_line(error))
        arrays = {}
        for name in (SRC_IDS, SRC_OFFSETS, TGT_IDS, TGT_OFFSETS, LINE_NUMBERS):
            path = os.path.join(directory, name)
            check_condition(os.path.isfile(path), f"{path}: missing (encoded corpus incomplete)")
            try:
                arrays[name] = np.load(path, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError, EOFError) as error:  # truncated, object dtype, garbage
                check_corpus_file(False, path, first_line(error))
            check_corpus_file(arrays[name].ndim == 1 and arrays[name].dtype.kind in "iu", path,
                              f"a 1-d integer array expected, found {arrays[name].dtype} of "
                              f"shape {arrays[name].shape}")
        n_pairs = len(arrays[LINE_NUMBERS])
        check_corpus_file(n_pairs == stats.n_kept, os.path.join(directory, LINE_NUMBERS),
                          f"{n_pairs} pairs, but {CORPUS_META} says {stats.n_kept}")
        for ids_name, offsets_name, vocab_size in ((SRC_IDS, SRC_OFFSETS, stats.src_vocab_size),
                                                   (TGT_IDS, TGT_OFFSETS, stats.tgt_vocab_size)):
            _check_encoded_side(directory, ids_name, arrays[ids_name], offsets_name,
                        arrays[offsets_name], n_pairs, vocab_size)
        corpus = cls(arrays[SRC_IDS], arrays[SRC_OFFSETS], arrays[TGT_IDS], arrays[TGT_OFFSETS],
                     arrays[LINE_NUMBERS], stats=stats)
        corpus.directory = directory   # where guide links (aligner/training/guidance.py) may lie beside it
        return corpus

    def __len__(self) -> int:
        return len(self.line_numbers)

    def check_ids(self, src_vocab_size: int, tgt_vocab_size: int) -> None:
        """One error line when an id lies outside the model's vocabularies (a corpus written
        before corpus.json recorded the sizes is checked here, when training knows them)."""
        for name, ids, size in ((SRC_IDS, self._src_ids, src_vocab_size),
                                (TGT_IDS, self._tgt_ids, tgt_vocab_size)):
            if len(ids):
                high = int(ids.max())
                check_corpus_file(high < size, os.path.join(self.directory or ".", name),
                                  f"id {high} outside the vocabulary of {size} tokens")

    def source(self, k: int) -> np.ndarray:
        return self._src_ids[self._src_offsets[k]:self._src_offsets[k + 1]]

    def target(self, k: int) -> np.ndarray:
        return self._tgt_ids[self._tgt_offsets[k]:self._tgt_offsets[k + 1]]

    def lines(self, start: int, stop: int, dtype: type = np.int64
              ) -> List[Tuple[np.ndarray, np.ndarray]]:
        """Pairs start..stop-1 as (source ids, target ids) arrays of `dtype`, read with one
        slice of each side (not two per pair: a Python-level read per pair costs more than the
        ids)."""
        if stop <= start:
            return []
        pairs = []
        for ids, offsets in ((self._src_ids, self._src_offsets),
                             (self._tgt_ids, self._tgt_offsets)):
            bounds = np.asarray(offsets[start:stop + 1], dtype=np.int64)
            block = np.asarray(ids[bounds[0]:bounds[-1]], dtype=dtype)
            pairs.append(np.split(block, bounds[1:-1] - bounds[0]))
        return list(zip(*pairs))


_REBUILD = "; train again with --overwrite to rebuild the encoded corpus"


def check_corpus_file(condition: bool, path: str, message: str) -> None:
    """AlignerError "PATH: damaged (MESSAGE); ...--overwrite..." unless `condition` holds
    (for every file of the encoded corpus directory, guide links included:
    aligner/training/guidance.py)."""
    if not condition:
        raise AlignerError(f"{path}: damaged ({message}){_REBUILD}")


def _check_encoded_side(directory: str, ids_name: str, ids: np.ndarray, offsets_name: str,
                offsets: np.ndarray, n_pairs: int, vocab_size: int) -> None:
    """Offsets of one side: n_pairs + 1 non-decreasing values from 0 to len(ids); ids: within
    [0, vocab_size) (only >= 0 when the size was not recorded)."""
    offsets_path = os.path.join(directory, offsets_name)
    check_corpus_file(len(offsets) == n_pairs + 1, offsets_path,
                      f"{len(offsets)} offsets for {n_pairs} pairs")
    check_corpus_file(offsets[0] == 0 and offsets[-1] == len(ids)
                      and bool(np.all(np.diff(offsets) >= 0)), offsets_path,
                      f"offsets must rise from 0 to the {len(ids)} ids of {ids_name}")
    if len(ids):
        low, high = int(ids.min()), int(ids.max())
        limit = vocab_size if vocab_size > 0 else None
        check_corpus_file(low >= 0 and (limit is None or high < limit),
                          os.path.join(directory, ids_name),
                          f"ids from {low} to {high}, outside the vocabulary"
                          + (f" of {limit} tokens" if limit else ""))


# ---------------------------------------------------------------------------------------------
# Training batches
# ---------------------------------------------------------------------------------------------

def _greedy_batches(order: Sequence[int], widths: np.ndarray, max_tokens: int,
                    max_sentences: Optional[int]) -> List[List[int]]:
    """Cut `order` (sorted by non-decreasing width) into consecutive batches whose padded size
    width_of_last_item * n stays within max_tokens (and n within max_sentences)."""
    batches: List[List[int]] = []
    current: List[int] = []
    width_list = widths.tolist()
    for index in order:
        width = width_list[index]  # the widest so far: `order` is sorted
        if current and (width * (len(current) + 1) > max_tokens
                        or (max_sentences and len(current) >= max_sentences)):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


class TokenBatcher:
    """Length-bucketed batches of pair indices under a token budget, reproducible and resumable.

    A pair occupies ``width = max(src_len + 1, tgt_len + 1)`` positions (EOS/BOS added); a batch
    of n pairs costs ``n * max width`` and never exceeds `max_tokens` (and n never exceeds
    `max_sentences` when given). Each epoch sorts the pairs by width (ties broken randomly with
    shuffle, by index without), cuts batches greedily and, with shuffle, shuffles the batch
    order; everything is a function of (seed, epoch), so every run and every rank agrees.

    Sharding: with world_size > 1 the epoch's batches are dealt round robin, rank r taking
    batches r, r + world_size, ...; the last ``n_batches % world_size`` batches of the epoch are
    DROPPED so that every rank does the same number of steps. With shuffle the dropped batches
    differ from epoch to epoch, so no pair is left out for good; without shuffle (meant for
    single-process evaluation) the same longest batches are dropped every epoch.

    Iterating yields the rest of the current epoch (lists of pair indices) and then moves to the
    next epoch; :meth:`state_dict` records (epoch, position) so that a resumed run continues with
    exactly the batches the interrupted one would have seen next.
    """

    def __init__(self, src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int,
                 seed: int = C.DEFAULT_SEED, shuffle: bool = True, rank: int = 0,
                 world_size: int = 1, max_sentences: Optional[int] = None):
        src = np.asarray(src_lengths, dtype=np.int64)
        tgt = np.asarray(tgt_lengths, dtype=np.int64)
        if src.shape != tgt.shape or src.ndim != 1:
            raise ValueError("src_lengths and tgt_lengths must be 1-d and of equal length")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        check_condition(len(src) > 0, "no training pairs to batch")
        self.widths = np.maximum(src, tgt) + 1
        longest = int(self.widths.max())
        check_condition(max_tokens >= longest,
                        f"--max-tokens {max_tokens} is smaller than the longest training pair "
                        f"({longest} positions with EOS); raise it or lower the length limit")
        check_condition(max_sentences is None or max_sentences >= 1, "max_sentences must be >= 1")
        self.max_tokens = int(max_tokens)
        self.max_sentences = max_sentences
        self.seed = int(seed)
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.position = 0
        self._cache: Tuple[int, List[List[int]], List[List[int]]] = (-1, [], [])
        check_condition(len(self) > 0,
                        f"only {len(self._all_batches(0))} batch(es) per epoch for {world_size} "
                        f"ranks: lower --max-tokens or use fewer ranks")

    @classmethod
    def from_corpus(cls, corpus: EncodedCorpus, max_tokens: int, **options: Any) -> "TokenBatcher":
        return cls(corpus.src_lengths, corpus.tgt_lengths, max_tokens, **options)

    def _all_batches(self, epoch: int) -> List[List[int]]:
        """All ranks' batches of `epoch`, in the order they are dealt."""
        if not self.shuffle:
            order = np.argsort(self.widths, kind="stable")
            return _greedy_batches(order.tolist(), self.widths, self.max_tokens,
                                   self.max_sentences)
        rng = np.random.default_rng([self.seed, epoch])
        tie_break = rng.permutation(len(self.widths))
        order = np.lexsort((tie_break, self.widths))  # by width, ties in random order
        batches = _greedy_batches(order.tolist(), self.widths, self.max_tokens,
                                  self.max_sentences)
        return [batches[i] for i in rng.permutation(len(batches))]

    def epoch_batches(self, epoch: int) -> List[List[int]]:
        """This rank's batches of `epoch` (a pure function of the settings and `epoch`)."""
        return self._epoch(epoch)[1]

    def _epoch(self, epoch: int) -> Tuple[List[List[int]], List[List[int]]]:
        """All ranks' batches of `epoch` and this rank's share of them (cached per epoch)."""
        if self._cache[0] != epoch:
            batches = self._all_batches(epoch)
            per_rank = len(batches) // self.world_size
            self._cache = (epoch, batches[self.rank:per_rank * self.world_size:self.world_size],
                           batches)
        return self._cache[2], self._cache[1]

    def slot_batches(self, epoch: int, position: int) -> List[List[int]]:
        """The batches that ranks 0 .. world_size-1 take as their batch number `position`
        (0-based) of `epoch`: this rank's own batch among them. Every rank computes the same
        list without asking the others (the batches are a function of the settings and the
        epoch), e.g. the token count of an update over all ranks without a collective."""
        batches = self._epoch(epoch)[0]
        check_condition(0 <= position < len(self.epoch_batches(epoch)),
                        f"batch {position} outside the {len(self)} batches of an epoch")
        return batches[position * self.world_size:(position + 1) * self.world_size]

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same for every epoch and every rank)."""
        return len(self.epoch_batches(self.epoch))

    def __iter__(self) -> Iterator[List[int]]:
        """The remaining batches of the current epoch; then the epoch counter moves on."""
        if self.position >= len(self):  # the previous epoch was consumed to its end
            self.epoch, self.position = self.epoch + 1, 0
        batches = self.epoch_batches(self.epoch)
        while self.position < len(batches):
            batch = batches[self.position]
            self.position += 1  # counted as seen once handed out
            yield batch
        self.epoch, self.position = self.epoch + 1, 0

    def forever(self) -> Iterator[List[int]]:
        """Batches of this and all following epochs, without end (for update-count training)."""
        while True:
            yield from self

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its first batch."""
        self.epoch, self.position = int(epoch), 0

    def state_dict(self) -> Dict[str, Any]:
        """Where the iteration stands, plus the settings that must match on resume."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "shuffle": self.shuffle, "max_tokens": self.max_tokens,
                "max_sentences": self.max_sentences, "world_size": self.world_size,
                "n_items": len(self.widths)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; AlignerError if the settings or data changed."""
        for key, mine in (("seed", self.seed), ("shuffle", self.shuffle),
                          ("max_tokens", self.max_tokens), ("max_sentences", self.max_sentences),
                          ("world_size", self.world_size), ("n_items", len(self.widths))):
            check_condition(state.get(key) == mine,
                            f"cannot resume: batching setting {key} was {state.get(key)} in the "
                            f"saved run and is {mine} now")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


# ---------------------------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------------------------

@dataclass
class Batch:
    """Model input of one direction (see aligner/models/base.py), all LongTensors, PAD = 0.

    src (B, J+1): encoder ids + EOS; tgt_in (B, I+1): BOS + decoder ids;
    tgt_out (B, I+1): decoder ids + EOS. For direction "rev" the encoder reads the target
    language and the decoder predicts the source language.
    """

    src: "torch.Tensor"
    tgt_in: "torch.Tensor"
    tgt_out: "torch.Tensor"

    @property
    def size(self) -> int:
        return int(self.src.shape[0])

    @property
    def n_tokens(self) -> int:
        """Number of predicted (non-pad) decoder tokens, EOS included."""
        return int((self.tgt_out != C.PAD_ID).sum())

    def to(self, device: Any, non_blocking: bool = False) -> "Batch":
        return Batch(*(t.to(device, non_blocking=non_blocking)
                       for t in (self.src, self.tgt_in, self.tgt_out)))


def _padded(sequences: Sequence[Sequence[int]], prefix: Optional[int], suffix: Optional[int]
            ) -> np.ndarray:
    """(B, max_len + 1) int64 array: [prefix] + seq + [suffix], right-padded with PAD_ID."""
    width = max(len(s) for s in sequences) + 1
    out = np.full((len(sequences), width), C.PAD_ID, dtype=np.int64)
    for row, seq in enumerate(sequences):
        start = 0
        if prefix is not None:
            out[row, 0] = prefix
            start = 1
        out[row, start:start + len(seq)] = seq
        if suffix is not None:
            out[row, start + len(seq)] = suffix
    return out


def make_batch(source_ids: Sequence[Sequence[int]], target_ids: Sequence[Sequence[int]],
               direction: str) -> Batch:
    """Tensors for one direction from per-pair id arrays (source / target language, no EOS).

    "fwd": encoder = source language, decoder = target language; "rev": the other way round.
    """
    import torch

    if direction not in C.DIRECTIONS:
        raise ValueError(f"direction must be one of {C.DIRECTIONS}, not {direction!r}")
    if len(source_ids) != len(target_ids) or not source_ids:
        raise ValueError("make_batch needs equally many (and at least one) source and target")
    encoder, decoder = (source_ids, target_ids) if direction == "fwd" else (target_ids, source_ids)
    src = _padded(encoder, None, C.EOS_ID)
    tgt_in = _padded(decoder, C.BOS_ID, None)
    tgt_out = _padded(decoder, None, C.EOS_ID)
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out))


# ---------------------------------------------------------------------------------------------
# Inference
# ---------------------------------------------------------------------------------------------

@dataclass
class EncodedPair:
    """One sentence pair ready for a model, with the maps back to words.

    src_ids / tgt_ids: int64 (n_subwords,) ids without EOS; src_word_index[k] = word of source
    subword k (likewise for the target).
    """

    src_ids: np.ndarray
    tgt_ids: np.ndarray
    src_word_index: List[int]
    tgt_word_index: List[int]

    @property
    def width(self) -> int:
        """Positions the pair occupies in a batch: max(src_len + 1, tgt_len + 1)."""
        return max(len(self.src_ids), len(self.tgt_ids)) + 1


def encode_pair(pre: Preprocessor, src_vocab: Vocabulary, tgt_vocab: Vocabulary,
                src_words: Sequence[str], tgt_words: Sequence[str]) -> EncodedPair:
    """Segment and encode one pair of word lists (either may be empty: then no links)."""
    src = pre.segment(src_words, "src")
    tgt = pre.segment(tgt_words, "tgt")
    return EncodedPair(np.asarray(src_vocab.encode(src.subwords), dtype=np.int64),
                       np.asarray(tgt_vocab.encode(tgt.subwords), dtype=np.int64),
                       src.word_index, tgt.word_index)


def inference_batches(n_items: int, lengths: Sequence[int], max_tokens: int
                      ) -> List[List[int]]:
    """Indices 0..n_items-1 grouped into batches of similar length, longest first.

    lengths[k]: positions item k occupies (e.g. :attr:`EncodedPair.width`). A batch of n items
    costs n * (its longest length) <= max_tokens; an item longer than max_tokens gets a batch
    of its own (nothing is ever dropped). Every index appears exactly once; use
    :func:`restore_order` to put per-item results back into input order.
    """
    widths = np.asarray(lengths, dtype=np.int64)
    if widths.shape != (n_items,):
        raise ValueError(f"expected {n_items} lengths, got {widths.shape}")
    check_condition(max_tokens >= 1, "max_tokens must be >= 1")
    order = np.argsort(-widths, kind="stable").tolist()
    batches: List[List[int]] = []
    limit = 0
    for index in order:
        if not batches or len(batches[-1]) >= limit:
            batches.append([])
            limit = max(1, max_tokens // max(1, int(widths[index])))  # first = longest
        batches[-1].append(index)
    return batches


T = TypeVar("T")


def restore_order(batches: Sequence[Sequence[int]], batch_results: Sequence[Sequence[T]]
                  ) -> List[T]:
    """Per-item results in input order, from results given batch by batch."""
    n = sum(len(batch) for batch in batches)
    out: List[Any] = [None] * n
    seen = [False] * n
    if len(batches) != len(batch_results):
        raise ValueError(f"{len(batches)} batches but {len(batch_results)} batch results")
    for batch, results in zip(batches, batch_results):
        if len(batch) != len(results):
            raise ValueError("a batch and its results differ in length")
        for index, result in zip(batch, results):
            if seen[index]:
                raise ValueError(f"index {index} occurs twice")
            seen[index] = True
            out[index] = result
    if not all(seen):
        raise ValueError("the batches do not cover every index")
    return out


def subword_to_word_links(links: Iterable[Tuple[int, int]], src_word_index: Sequence[int],
                          tgt_word_index: Sequence[int]) -> Set[Tuple[int, int]]:
    """Word links (i, j) from subword links (s, t): words are linked if any of their subwords
    are. Positions are 0-based, source first; an EOS or pad position is an error (mask it)."""
    words: Set[Tuple[int, int]] = set()
    for s, t in links:
        if not (0 <= s < len(src_word_index) and 0 <= t < len(tgt_word_index)):
            raise ValueError(f"subword link {s}-{t} outside a {len(src_word_index)} x "
                             f"{len(tgt_word_index)} sentence pair")
        words.add((src_word_index[s], tgt_word_index[t]))
    return words
