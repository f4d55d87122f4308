"""Text preprocessing: tokenization (sacremoses), BPE (subword-nmt) and the subword->word map.

The pipeline for one sentence is ``line --tokenize_line--> words --segment--> subwords``.
Gold alignments and Pharaoh output index *words* (0-based), models see *subwords*; the
``word_index`` of a :class:`Segmented` sentence maps every subword position back to its word.

Words are separated by ASCII spaces and tabs only, like fast_align, the gold sets and
``aligner.formats``; other Unicode spaces (e.g. U+00A0) stay inside their token, so word
indices never shift.

BPE is subword-nmt's: ``learn_bpe`` writes a codes file that starts with a ``#version: 0.2``
header, ``apply_bpe.BPE`` applies it, and a subword that is not the last of its word carries
the ``@@`` continuation marker ("Hans@@ ards" = "Hansards"). Joint BPE learns one codes file on
the words of both sides and saves it under both names; separate BPE learns one per side.
No torch here.
"""
from __future__ import annotations

import io
import json
import logging
import os
import random
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields
from itertools import zip_longest
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, TypeVar

from aligner import constants as C
from aligner.config import dataclass_from_dict
from aligner.formats import tokenize_line
from aligner.training import recipe
from aligner.utils import AlignerError, atomic_output, check_condition

logger = logging.getLogger(__name__)
T = TypeVar("T")

PREP_CONFIG_NAME = "prep.json"
SIDES = ("src", "tgt")

_WORD_SEPARATOR = re.compile(r"[ \t]")


def split_words(line: str) -> List[str]:
    """Tokens of a pre-tokenized line, exactly as :func:`aligner.formats.tokenize_line` splits
    them (ASCII spaces and tabs only); a line end (LF or CR LF) is removed first."""
    if line.endswith("\n"):
        line = line[:-1]
    if line.endswith("\r"):
        line = line[:-1]
    return tokenize_line(line)


@dataclass
class PrepConfig:
    """How raw lines become subwords. Saved as ``prep.json`` in the model directory.

    tokenize: run the Moses tokenizer (sacremoses, no escaping, no aggressive dash splitting)
        on each line; off by default because gold sets index pre-tokenized words.
    lowercase: lowercase after tokenization.
    bpe_merges: number of BPE merge operations (0 = no BPE, words are the units).
    joint_bpe: one codes file learned on both sides (True) or one per side.
    bpe_min_frequency: stop merging when the most frequent pair occurs less often.
    bpe_sample_sentences: learn BPE on at most this many sentence pairs (a seeded random
        sample; 0 = all, the default: on the 407k en-fr Hansards pairs learning 10k merges on
        all of them took 36 s, and a 100k sample shared 94% of the merges).
    """

    tokenize: bool = False
    src_lang: str = "en"
    tgt_lang: str = "fr"
    lowercase: bool = False
    bpe_merges: int = recipe.BPE_MERGES_MAX   # the recipe's for a large corpus
    joint_bpe: bool = True
    bpe_min_frequency: int = 2
    bpe_sample_sentences: int = 0

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def __post_init__(self) -> None:
        check_condition(self.bpe_merges >= 0, f"bpe_merges must be >= 0: {self.bpe_merges}")
        check_condition(self.bpe_min_frequency >= 1,
                        f"bpe_min_frequency must be >= 1: {self.bpe_min_frequency}")
        check_condition(self.bpe_sample_sentences >= 0,
                        f"bpe_sample_sentences must be >= 0 (0 = all): "
                        f"{self.bpe_sample_sentences}")

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "PrepConfig":
        """Build from a dict (as in prep.json), refusing unknown keys and values of the wrong
        type (:func:`aligner.config.dataclass_from_dict`)."""
        check_condition(isinstance(values, dict), "expected a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        check_condition(not unknown, f"unknown preprocessing option(s): {', '.join(unknown)}")
        return dataclass_from_dict(cls, values)


@dataclass
class Segmented:
    """One sentence after BPE.

    subwords: the BPE units, "@@" marking a unit that continues into the next one.
    word_index: word_index[k] = 0-based index of the input word that subwords[k] belongs to;
        non-decreasing, len(word_index) == len(subwords).
    """

    subwords: List[str]
    word_index: List[int]

    def words(self) -> List[str]:
        """The input words back: the pieces of each word joined, continuation markers removed."""
        sep = C.BPE_SEPARATOR
        words: List[str] = []
        for k, (piece, word) in enumerate(zip(self.subwords, self.word_index)):
            continues = k + 1 < len(self.word_index) and self.word_index[k + 1] == word
            if continues:  # every piece but the last of its word carries the marker
                if not piece.endswith(sep):
                    raise ValueError(f"subword {piece!r} inside a word lacks {sep!r}")
                piece = piece[: -len(sep)]
            if word == len(words):
                words.append(piece)
            else:
                words[word] += piece
        return words


class _Bpe:
    """A thin wrapper over subword-nmt's BPE that segments one word at a time (cached)."""

    def __init__(self, codes_text: str):
        from subword_nmt.apply_bpe import BPE

        self.codes_text = codes_text
        merges = [line for line in codes_text.split("\n")[1:] if line.strip()]
        # subword-nmt cannot read a codes file without merges; BPE without merges = characters
        self._bpe = BPE(io.StringIO(codes_text), separator=C.BPE_SEPARATOR) if merges else None
        self.n_merges = len(merges)
        self._cache: Dict[str, Tuple[str, ...]] = {}

    def pieces(self, word: str) -> Tuple[str, ...]:
        cached = self._cache.get(word)
        if cached is None:
            if self._bpe is not None:
                cached = tuple(self._bpe.segment_tokens([word]))
            else:
                cached = tuple(char + C.BPE_SEPARATOR for char in word[:-1]) + (word[-1],)
            self._cache[word] = cached
        return cached


def _learn_codes(counts: Counter, config: PrepConfig, what: str) -> str:
    """Run subword-nmt's learn_bpe on word counts; returns the codes file text (with header)."""
    from unittest import mock

    import subword_nmt.learn_bpe as subword_learn

    check_condition(len(counts) > 0, f"cannot learn BPE for {what}: the training text has no words")
    start = time.time()
    # dictionary input ("word count" lines) skips subword-nmt's own pass over the text
    dict_text = "".join(f"{word} {count}\n" for word, count in counts.items())
    codes = io.StringIO()
    if any(len(word) > 1 for word in counts):
        # subword-nmt draws a tqdm bar over the merges whatever the caller wants (even under
        # `-q`); this module logs the result instead, so its bar is replaced by a no-op
        with mock.patch.object(subword_learn, "tqdm", lambda iterable, *_, **__: iterable):
            subword_learn.learn_bpe(io.StringIO(dict_text), codes, config.bpe_merges,
                                    min_frequency=config.bpe_min_frequency, is_dict=True)
    else:  # only one-character words: nothing to merge (learn_bpe would fail on empty stats)
        codes.write("#version: 0.2\n")
    text = codes.getvalue()
    n_merges = sum(1 for line in text.split("\n")[1:] if line.strip())
    logger.info("learned %d BPE merges for %s (%d word types) in %.1fs", n_merges, what,
                len(counts), time.time() - start)
    return text


class WordCounts:
    """Word occurrences of both sides of a bitext, counted pair by pair (``add``): all that
    learning BPE and building the vocabularies need, in memory bounded by the word types."""

    def __init__(self) -> None:
        self.src: Counter = Counter()
        self.tgt: Counter = Counter()
        self.n_pairs = 0

    def add(self, src_words: Sequence[str], tgt_words: Sequence[str]) -> None:
        self.src.update(src_words)
        self.tgt.update(tgt_words)
        self.n_pairs += 1


class Preprocessor:
    """Tokenizes lines and segments words into BPE subwords for both sides of a bitext.

    Build with :meth:`learn` (training) or :meth:`load` (from a model directory).
    ``Preprocessor(config)`` without codes can tokenize (to get the words to learn BPE on)
    but not segment, unless ``config.bpe_merges`` is 0.
    """

    def __init__(self, config: PrepConfig, codes_src: Optional[str] = None,
                 codes_tgt: Optional[str] = None):
        self.config = config
        self._bpe: Dict[str, Optional[_Bpe]] = {"src": None, "tgt": None}
        # Without codes a BPE config can tokenize but not segment (before learning).
        self._has_codes = config.bpe_merges == 0 or (codes_src is not None
                                                     and codes_tgt is not None)
        if config.bpe_merges > 0 and self._has_codes:
            self._bpe = {"src": _Bpe(codes_src), "tgt": _Bpe(codes_tgt)}
        self._tokenizers: Dict[str, Any] = {}

    # -- learning -------------------------------------------------------------------------

    @classmethod
    def learn(cls, config: PrepConfig, src_sentences: Iterable[Sequence[str]],
              tgt_sentences: Iterable[Sequence[str]], seed: int = C.DEFAULT_SEED
              ) -> "Preprocessor":
        """Learn BPE codes from tokenized training sentences (lists of words, both sides).

        Callers tokenize first with :meth:`tokenize_line` of a Preprocessor built from the same
        config (``Preprocessor(config)`` works before learning). The inputs may be generators:
        only word counts are kept, so a large corpus can be streamed. With
        ``config.bpe_sample_sentences`` > 0 a seeded random sample (reservoir sampling) of that
        many pairs is used instead of all.
        """
        check_condition(config.bpe_merges >= 0, "the number of BPE merges must be >= 0")
        pairs: Iterable[Tuple[Sequence[str], Sequence[str]]] = paired(src_sentences,
                                                                      tgt_sentences)
        if config.bpe_merges == 0:
            for _ in pairs:  # still check that the sides are line-aligned
                pass
            return cls(config)
        if config.bpe_sample_sentences > 0:
            pairs = _reservoir_sample(pairs, config.bpe_sample_sentences, seed)
        counts = WordCounts()
        for src_words, tgt_words in pairs:
            counts.add(src_words, tgt_words)
        return cls.learn_from_counts(config, counts)

    @classmethod
    def learn_from_counts(cls, config: PrepConfig, counts: "WordCounts") -> "Preprocessor":
        """Learn BPE codes from the word counts of the training pairs (all of them: the
        sample of ``config.bpe_sample_sentences`` is :meth:`learn`'s business)."""
        if config.bpe_merges == 0:
            return cls(config)
        logger.info("learning BPE (%d merges) on %d sentence pairs", config.bpe_merges,
                    counts.n_pairs)
        for side_counts in (counts.src, counts.tgt):
            bad = [word for word in side_counts if not word or _WORD_SEPARATOR.search(word)]
            check_condition(not bad, f"BPE training words must be non-empty and without spaces: "
                                     f"{bad[:3]!r}")
        if config.joint_bpe:
            codes = _learn_codes(counts.src + counts.tgt, config, "both sides (joint)")
            return cls(config, codes, codes)
        return cls(config, _learn_codes(counts.src, config, "the source side"),
                   _learn_codes(counts.tgt, config, "the target side"))

    # -- applying -------------------------------------------------------------------------

    def tokenize_line(self, line: str, side: str) -> List[str]:
        """Words of one raw line: Moses-tokenized when ``config.tokenize`` (escape off, no
        aggressive dash splitting), else split on ASCII spaces and tabs (:func:`split_words`);
        lowercased when set."""
        _check_side(side)
        if self.config.tokenize:
            tokenizer = self._tokenizers.get(side)
            if tokenizer is None:
                from sacremoses import MosesTokenizer

                lang = self.config.src_lang if side == "src" else self.config.tgt_lang
                tokenizer = self._tokenizers[side] = MosesTokenizer(lang=lang)
            # sacremoses can return tokens with inner spaces for odd input; re-split them
            words = [w for token in tokenizer.tokenize(line, escape=False,
                                                       aggressive_dash_splits=False)
                     for w in split_words(token)]
        else:
            words = split_words(line)
        if self.config.lowercase:
            words = [w.lower() for w in words]
        return words

    def segment(self, words: Sequence[str], side: str) -> Segmented:
        """BPE-segment a sentence given as words; returns subwords and their word indices."""
        _check_side(side)
        if not self._has_codes:
            raise RuntimeError("BPE codes are missing: use Preprocessor.learn or .load")
        bpe = self._bpe[side]
        subwords: List[str] = []
        word_index: List[int] = []
        for i, word in enumerate(words):
            if not word:
                raise ValueError(f"empty word at position {i}")
            pieces = bpe.pieces(word) if bpe is not None else (word,)
            subwords.extend(pieces)
            word_index.extend([i] * len(pieces))
        return Segmented(subwords, word_index)

    def subword_counts(self, word_counts: Counter, side: str) -> Counter:
        """Occurrences of every subword in a text whose words occur `word_counts` times
        (each word type is segmented once): what counting the segmented sentences gives."""
        counts: Counter = Counter()
        for word, count in word_counts.items():
            for piece in self.segment([word], side).subwords:
                counts[piece] += count
        return counts

    def codes(self, side: str) -> Optional[str]:
        """The codes file text of one side (None without BPE)."""
        _check_side(side)
        bpe = self._bpe[side]
        return bpe.codes_text if bpe is not None else None

    # -- model directory ------------------------------------------------------------------

    def save(self, model_dir: str) -> None:
        """Write ``prep.json`` and (with BPE) the two codes files into `model_dir`."""
        with atomic_output(os.path.join(model_dir, PREP_CONFIG_NAME)) as out:
            json.dump(self.config.to_dict(), out, indent=2)
            out.write("\n")
        if self.config.bpe_merges > 0:
            for side, name in (("src", C.BPE_CODES_SRC), ("tgt", C.BPE_CODES_TGT)):
                with atomic_output(os.path.join(model_dir, name)) as out:
                    out.write(self.codes(side))

    @classmethod
    def load(cls, model_dir: str) -> "Preprocessor":
        """Read a Preprocessor saved by :meth:`save`; AlignerError naming the missing file."""
        path = os.path.join(model_dir, PREP_CONFIG_NAME)
        check_condition(os.path.isfile(path), f"{path}: missing (model directory incomplete)")
        try:
            with open(path, encoding="utf-8") as handle:
                config = PrepConfig.from_dict(json.load(handle))
        except (ValueError, TypeError, AlignerError) as error:
            raise AlignerError(f"{path}: not a valid preprocessing config ({error})") from None
        codes: Dict[str, Optional[str]] = {"src": None, "tgt": None}
        if config.bpe_merges > 0:
            for side, name in (("src", C.BPE_CODES_SRC), ("tgt", C.BPE_CODES_TGT)):
                codes_path = os.path.join(model_dir, name)
                check_condition(os.path.isfile(codes_path),
                                f"{codes_path}: missing (model directory incomplete)")
                text = _read_codes(codes_path)
                _check_codes(text, codes_path)
                codes[side] = text
        return cls(config, codes["src"], codes["tgt"])


def paired(src_sentences: Iterable[T], tgt_sentences: Iterable[T]) -> Iterator[Tuple[T, T]]:
    """zip() that raises AlignerError when one side ends before the other."""
    missing = object()
    for k, (src, tgt) in enumerate(zip_longest(src_sentences, tgt_sentences, fillvalue=missing)):
        if src is missing or tgt is missing:
            side, other = ("target", "source") if tgt is missing else ("source", "target")
            raise AlignerError(f"the {side} side has fewer sentences than the {other} side "
                               f"(it ends before sentence {k + 1})")
        yield src, tgt  # type: ignore[misc]


def _reservoir_sample(items: Iterable[T], size: int, seed: int) -> List[T]:
    """A uniform random sample of `size` items (all if fewer), in input order (Algorithm R)."""
    rng = random.Random(seed)
    chosen: List[Tuple[int, T]] = []
    for i, item in enumerate(items):
        if i < size:
            chosen.append((i, item))
        else:
            j = rng.randrange(i + 1)
            if j < size:
                chosen[j] = (i, item)
    return [item for _, item in sorted(chosen, key=lambda pair: pair[0])]


def _check_side(side: str) -> None:
    if side not in SIDES:
        raise ValueError(f"side must be 'src' or 'tgt', not {side!r}")


def _read_codes(path: str) -> str:
    """The text of a codes file (UTF-8, line ends kept); one error line naming the file and
    line when it is not UTF-8."""
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[:error.start].count(b"\n") + 1
        raise AlignerError(f"{path}:{line}: not UTF-8 text (byte {raw[error.start]:#04x}); "
                           f"a BPE codes file is UTF-8") from None


def _check_codes(text: str, path: str) -> None:
    """One clear line for a damaged codes file (subword-nmt itself would sys.exit)."""
    lines = text.split("\n")
    check_condition(lines[0].startswith("#version:"),
                    f"{path}:1: not a subword-nmt codes file (no '#version:' header)")
    if lines[-1] == "":  # the final line end
        lines.pop()
    for number, line in enumerate(lines[1:], start=2):
        if len(line.strip("\r\n ").split(" ")) != 2:
            raise AlignerError(f"{path}:{number}: a BPE merge must be two units separated by "
                               f"one space, got {line!r}")
