"""Every file format `align` reads or writes: bitext, Pharaoh alignments, gold alignments.

Conventions, shared by the whole package:

* A *link* is a pair ``(i, j)`` of 0-based word indices, ``i`` in the source sentence and ``j``
  in the target sentence (source–target orientation), whatever model direction produced it.
* A sentence pair's alignment is a ``set`` of links; a corpus is a list with one set per line.
* Files are UTF-8 and line-aligned. Lines are split on ``\\n`` only (a trailing ``\\r`` is
  removed), so a stray carriage return or Unicode line separator inside a line never shifts the
  lines that follow. Tokens are separated by ASCII spaces and tabs only: a non-breaking space
  or another Unicode space stays inside its token (Python's ``str.split()`` would split there
  and shift every later word index; fast_align, a C++ tool, does not split there either).
  An input file may be gzip-compressed (known by its first bytes): it is read decompressed.
* A user error raises :class:`aligner.utils.AlignerError` with one line ``"file:line: message"``.

Pharaoh format: one line per sentence pair, links ``i-j`` separated by spaces, an empty line
when nothing is linked. Gold ("talp") format: the same, with ``ipj`` or ``i?j`` for a
possible-only link. NAACL/WPT format (Mihalcea & Pedersen 2003): one link per line,
``sentence source target [S|P] [confidence]``, all 1-based, position 0 = NULL (dropped), a link
without a label is sure.

This module does not import torch.
"""
from __future__ import annotations

import gzip
import itertools
import os
import re
import stat
import sys
import zlib
from dataclasses import dataclass, field
from typing import IO, Any, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from aligner.utils import AlignerError, atomic_output, check_condition

Link = Tuple[int, int]
Alignment = Set[Link]

GOLD_FORMATS = ("talp", "naacl")

_LINK = re.compile(r"([0-9]+)-([0-9]+)")  # ASCII digits only (\d would accept "١-٢")
_GOLD_LINK = re.compile(r"([0-9]+)([-p?])([0-9]+)")
# a whole well-formed line, checked in one pass before the links are extracted
_LINK_LINE = re.compile(r"[ \t]*(?:[0-9]+-[0-9]+(?:[ \t]+|\Z))*")
_GOLD_LINE = re.compile(r"[ \t]*(?:[0-9]+[-p?][0-9]+(?:[ \t]+|\Z))*")
_NUMBER = re.compile(r"[0-9]+")
_TOKEN_SEPARATOR = re.compile(r"[ \t]+")
JOINT_SEPARATOR = "|||"


@dataclass
class Bitext:
    """Tokenized parallel text: ``source[k]`` and ``target[k]`` are the words of line ``k + 1``.

    An empty input line gives ``[]``; the lists always have one entry per input line and the
    same length (``first_line``: the input line number of the first entry, when this is a
    block of a longer bitext, :func:`bitext_blocks`). ``source_name``/``target_name`` are the file names used in error messages
    (the same file for a joint ``source ||| target`` file).
    """

    source: List[List[str]]
    target: List[List[str]]
    source_name: str
    target_name: str
    first_line: int = 1   # input line (1-based) of source[0]: a block of a longer bitext

    def __iter__(self) -> Iterator[Tuple[List[str], List[str]]]:
        """(source words, target words) of every line, in order (as :class:`BitextFiles`)."""
        return zip(self.source, self.target)

    def pairs_at(self, lines: Sequence[int]) -> Iterator[Tuple[List[str], List[str]]]:
        """(source words, target words) of the 0-based `lines`, in order (as
        :meth:`BitextFiles.pairs_at`, here by indexing)."""
        return ((self.source[k], self.target[k]) for k in lines)

    def __len__(self) -> int:
        return len(self.source)


@dataclass
class GoldAlignment:
    """Gold links of one sentence pair: ``sure`` ⊆ ``possible`` (0-based, source–target)."""

    sure: Alignment = field(default_factory=set)
    possible: Alignment = field(default_factory=set)

    def __post_init__(self) -> None:
        self.possible = set(self.possible) | set(self.sure)


def tokenize_line(line: str) -> List[str]:
    """Split a pre-tokenized line on ASCII spaces and tabs (never on other Unicode spaces)."""
    return [token for token in _TOKEN_SEPARATOR.split(line) if token]


def read_lines(path: str) -> List[str]:
    """Read a UTF-8 text file as a list of lines, without their line ends.

    ``path`` ``"-"`` reads standard input. Raises AlignerError for a missing file, a
    directory, a file that is empty (0 bytes) or not UTF-8 (naming the first bad line).
    A final line without ``\\n`` counts as a line; a trailing ``\\r`` (Windows line end) and
    a leading UTF-8 byte-order mark are removed.
    """
    if path == "-":
        data = sys.stdin.buffer.read()
        check_condition(len(data) > 0 and data != _BOM, f"{path}: empty file")
        check_condition(not data.startswith(GZIP_MAGIC), gzip_on_a_pipe(path))
        raw_lines = data.split(b"\n")
        if data.endswith(b"\n"):
            raw_lines.pop()
        return list(_decoded(raw_lines, path))
    return list(iter_lines(path))


_BOM = b"\xef\xbb\xbf"


#: the first two bytes of a gzip file (never the start of UTF-8 text: 0x8b cannot follow 0x1f)
GZIP_MAGIC = b"\x1f\x8b"


def iter_lines(path: str) -> Iterator[str]:
    """The lines of a UTF-8 text file, one at a time, exactly as :func:`read_lines` gives them
    (the same errors; a file, not ``"-"``): memory does not grow with the file. A gzip file
    (known by its first bytes, whatever its name) is read decompressed, as its text would be;
    damaged compressed data raises AlignerError naming the file and the line being read.
    gzip data on a pipe or FIFO is refused in one line (decompressing it needs the file)."""
    check_condition(os.path.exists(path), f"{path}: no such file")
    check_condition(not os.path.isdir(path), f"{path}: is a directory, expected a file")
    try:
        handle = open(path, "rb")
    except OSError as error:
        raise AlignerError(f"{path}: cannot read: {error.strerror}") from None
    with handle:
        raw_lines: Iterator[bytes] = iter(handle)
        if handle.peek(len(GZIP_MAGIC)).startswith(GZIP_MAGIC):   # (peek reads nothing away)
            check_condition(handle.seekable(), gzip_on_a_pipe(path))
            raw_lines = _gzip_lines(handle, path)
        first = next(raw_lines, b"")
        if first.startswith(_BOM):  # a UTF-8 byte-order mark is not part of the text
            first = first[len(_BOM):]
        check_condition(len(first) > 0, f"{path}: empty file")
        yield from _decoded(_chained(first, raw_lines), path)


def gzip_on_a_pipe(path: str) -> str:
    """The error line for gzip data read from a pipe, a FIFO or standard input."""
    return (f"{path}: gzip-compressed data on a pipe: give the .gz file itself, or decompress "
            f"into the pipe (zcat)")


def _gzip_lines(handle: IO[bytes], path: str) -> Iterator[bytes]:
    """The decompressed lines (with their ``\\n``) of the gzip file open as `handle` (one
    member or several, as ``cat a.gz b.gz`` makes)."""
    with gzip.GzipFile(fileobj=handle, mode="rb") as stream:
        line_no = 0
        while True:
            try:
                raw = stream.readline()
            except (gzip.BadGzipFile, EOFError, zlib.error) as error:
                # (a member's CRC is checked at its end: the damage may lie before this line)
                raise AlignerError(f"{path}: damaged gzip data, found while reading line "
                                   f"{line_no + 1} ({error})") from None
            except OSError as error:
                raise AlignerError(f"{path}: cannot read: {error.strerror}") from None
            if not raw:
                return
            line_no += 1
            yield raw


def _chained(first: bytes, rest: Iterable[bytes]) -> Iterator[bytes]:
    """`first`, then every element of `rest`, each without its final ``\\n``."""
    for raw in itertools.chain((first,), rest):
        yield raw[:-1] if raw.endswith(b"\n") else raw


def _decoded(raw_lines: Iterable[bytes], path: str) -> Iterator[str]:
    """UTF-8 lines from raw lines without their ``\\n``; a trailing ``\\r`` is removed and
    a line that is not UTF-8 raises AlignerError naming the file and line."""
    for line_no, raw in enumerate(raw_lines, start=1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise AlignerError(f"{path}:{line_no}: not valid UTF-8 "
                               f"(byte 0x{raw[error.start]:02x} at column {error.start + 1})"
                               ) from None


def check_same_length(name_a: str, count_a: int, name_b: str, count_b: int) -> None:
    """Raise AlignerError naming both files when their line counts differ."""
    if count_a != count_b:
        raise AlignerError(f"{name_b}:{min(count_a, count_b) + 1}: line counts differ: "
                           f"{name_a} has {count_a} lines, {name_b} has {count_b}")


def read_bitext(source: Optional[str] = None, target: Optional[str] = None,
                joint: Optional[str] = None) -> Bitext:
    """Read parallel text from two line-aligned files or one ``source ||| target`` file.

    Give either ``source`` and ``target``, or ``joint`` alone. Every line is kept (an empty
    line gives an empty sentence); errors name the file and line: not UTF-8, empty file,
    different line counts, a joint line without (or with more than one) ``|||``.
    """
    if joint is not None:
        check_condition(source is None and target is None, "give either a joint file (-i) "
                                                           "or source and target files (-s/-t)")
        src_sentences, tgt_sentences = [], []
        for line_no, line in enumerate(read_lines(joint), start=1):
            src_words, tgt_words = joint_sides(line, joint, line_no)
            src_sentences.append(src_words)
            tgt_sentences.append(tgt_words)
        return Bitext(src_sentences, tgt_sentences, joint, joint)
    check_condition(source is not None and target is not None,
                    "give source and target files (-s and -t) or one joint file (-i)")
    src_lines = read_lines(source)
    tgt_lines = read_lines(target)
    check_same_length(source, len(src_lines), target, len(tgt_lines))
    return Bitext([tokenize_line(line) for line in src_lines],
                  [tokenize_line(line) for line in tgt_lines], source, target)


def joint_sides(line: str, name: str, line_no: int) -> Tuple[List[str], List[str]]:
    """The words of the two sides of one ``source ||| target`` line."""
    parts = line.split(JOINT_SEPARATOR)
    check_condition(len(parts) > 1, f"{name}:{line_no}: missing '{JOINT_SEPARATOR}' "
                                    "between source and target")
    check_condition(len(parts) == 2, f"{name}:{line_no}: more than one "
                                     f"'{JOINT_SEPARATOR}' on the line")
    return tokenize_line(parts[0]), tokenize_line(parts[1])


class BitextFiles:
    """A bitext read from its files at every pass instead of held in memory.

    Iterating gives ``(source words, target words)`` per line, as iterating a :class:`Bitext`
    does, with the same errors as :func:`read_bitext` (file:line); only one line pair is in
    memory at a time, so a corpus of any size can be prepared for training in bounded memory.
    ``source`` / ``target`` are re-iterable views of one side's sentences (each pass reads
    the file again). ``len()`` is the number of lines, known after :meth:`check` (which
    reads the whole bitext once and raises on the first bad line).
    """

    def __init__(self, source: Optional[str] = None, target: Optional[str] = None,
                 joint: Optional[str] = None):
        if joint is not None:
            check_condition(source is None and target is None,
                            "give either a joint file (-i) or source and target files (-s/-t)")
            self.source_name = self.target_name = joint
        else:
            check_condition(source is not None and target is not None,
                            "give source and target files (-s and -t) or one joint file (-i)")
            self.source_name, self.target_name = source, target
        self.joint = joint
        self._length: Optional[int] = None

    def __iter__(self) -> Iterator[Tuple[List[str], List[str]]]:
        for line_no, raw in self._raw_lines():
            yield self._words(raw, line_no)

    def pairs_at(self, lines: Sequence[int]) -> Iterator[Tuple[List[str], List[str]]]:
        """(source words, target words) of the 0-based `lines` (strictly increasing, each below
        ``len(self)``: ValueError otherwise), in order, from one pass over the files that stops
        after the last of them. Only these lines are split into words (and a joint file's
        ``|||`` checked); every line up to the last is read and decoded as a full pass reads
        it (the same UTF-8, gzip and line-count errors, file:line), none after it: the full
        pass of :meth:`check`, which :func:`open_bitext` makes, finds those."""
        def increasing() -> Iterator[int]:
            previous = -1
            for line in lines:
                if line <= previous:
                    raise ValueError(f"pairs_at: lines must increase from 0 ({previous}, "
                                     f"{line})")
                previous = line
                yield line

        wanted = increasing()
        following = next(wanted, None)
        if following is None:
            return
        for line_no, raw in self._raw_lines():
            if line_no - 1 == following:
                yield self._words(raw, line_no)
                following = next(wanted, None)
                if following is None:
                    return
        raise ValueError(f"pairs_at: line {following} is past the end")

    def _raw_lines(self) -> Iterator[Tuple[int, Any]]:
        """(1-based line number, the raw line: the joint file's, or (source, target)) of every
        line, checking that the two files have as many lines."""
        if self.joint is not None:
            yield from enumerate(iter_lines(self.joint), start=1)
            return
        missing = object()
        src_lines, tgt_lines = iter_lines(self.source_name), iter_lines(self.target_name)
        count = 0
        for src, tgt in itertools.zip_longest(src_lines, tgt_lines, fillvalue=missing):
            if src is missing or tgt is missing:
                n_src = count + (src is not missing) + sum(1 for _ in src_lines)
                n_tgt = count + (tgt is not missing) + sum(1 for _ in tgt_lines)
                check_same_length(self.source_name, n_src, self.target_name, n_tgt)
            count += 1
            yield count, (src, tgt)

    def _words(self, raw: Any, line_no: int) -> Tuple[List[str], List[str]]:
        if self.joint is not None:
            return joint_sides(raw, self.joint, line_no)
        return tokenize_line(raw[0]), tokenize_line(raw[1])

    def check(self) -> int:
        """Read the whole bitext once (raising AlignerError at the first bad line); returns
        and remembers the number of lines."""
        if self._length is None:
            self._length = sum(1 for _ in self)
        return self._length

    def __len__(self) -> int:
        return self.check()

    @property
    def source(self) -> "_Side | PairsSide":
        return _Side(self, 0) if self.joint is None else PairsSide(self, 0)

    @property
    def target(self) -> "_Side | PairsSide":
        return _Side(self, 1) if self.joint is None else PairsSide(self, 1)


class _Side:
    """One side of a :class:`BitextFiles` of two files: iterating reads that side's file, its
    sentences (lists of words). (A joint file's side: :class:`PairsSide`.)"""

    def __init__(self, bitext: BitextFiles, index: int):
        self.bitext, self.index = bitext, index

    def __iter__(self) -> Iterator[List[str]]:
        path = self.bitext.source_name if self.index == 0 else self.bitext.target_name
        for line in iter_lines(path):
            yield tokenize_line(line)

    def __len__(self) -> int:
        return len(self.bitext)


class PairsSide:
    """One side of any bitext whose iteration gives (source words, target words) pairs (a
    sample of a bitext, its joined runs): iterating gives that side's sentences, one pass of
    the bitext each time."""

    def __init__(self, bitext: Any, index: int):
        self.bitext, self.index = bitext, index

    def __iter__(self) -> Iterator[List[str]]:
        for pair in self.bitext:
            yield pair[self.index]

    def __len__(self) -> int:
        return len(self.bitext)


def _rereadable(path: str) -> bool:
    """A regular file (a missing one too: reading it gives the error), not stdin or a pipe."""
    if path == "-":
        return False
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True


def open_bitext(source: Optional[str] = None, target: Optional[str] = None,
                joint: Optional[str] = None) -> "Bitext | BitextFiles":
    """The bitext of :func:`read_bitext` as a :class:`BitextFiles` (read at every pass, checked
    once now), or read into memory when a file can be read only once: standard input
    (``"-"``), a pipe such as bash's ``<(...)``, a FIFO."""
    if not all(_rereadable(path) for path in (source, target, joint) if path is not None):
        return read_bitext(source, target, joint)
    bitext = BitextFiles(source, target, joint)
    bitext.check()
    return bitext


def bitext_blocks(bitext: Iterable[Tuple[List[str], List[str]]], size: int,
                  source_name: str, target_name: str) -> Iterator[Bitext]:
    """Consecutive blocks of at most `size` lines of a bitext (a :class:`Bitext` or a
    :class:`BitextFiles`), each an in-memory Bitext that knows its first line number: a
    corpus of any size can be processed block by block in bounded memory."""
    check_condition(size >= 1, f"block size must be >= 1: {size}")
    pairs = iter(bitext)
    first_line = 1
    while True:
        block = list(itertools.islice(pairs, size))
        if not block:
            return
        first = first_line
        first_line += len(block)
        sources, targets = [s for s, _ in block], [t for _, t in block]
        del block   # only the yielded block is held while the caller works on it
        yield Bitext(sources, targets, source_name, target_name, first)
        del sources, targets


def parse_links(text: str, name: str, line_no: int) -> Alignment:
    """Parse one Pharaoh line (``"0-0 1-2"``) into a set of ``(i, j)`` links.

    Only ``i-j`` with non-negative integers is accepted; anything else raises
    ``AlignerError("name:line_no: malformed link '...'")``. Repeated links count once.
    """
    if _LINK_LINE.fullmatch(text):  # fast path: the whole line is well formed
        return {(int(i), int(j)) for i, j in _LINK.findall(text)}
    for token in tokenize_line(text):
        if _LINK.fullmatch(token) is None:
            raise AlignerError(f"{name}:{line_no}: malformed link '{token}' (expected i-j)")
    raise AssertionError(f"unparsed well-formed line {text!r}")  # pragma: no cover


def flip(links: Iterable[Link]) -> Alignment:
    """Swap the orientation of links: ``(i, j)`` becomes ``(j, i)``."""
    return {(j, i) for i, j in links}


def read_pharaoh(path: str, reverse: bool = False) -> List[Alignment]:
    """Read a Pharaoh file: one set of ``(source, target)`` links per line.

    ``reverse=True`` reads a file written target–source (GIZA++ style) and flips every link,
    so the result is always source–target.
    """
    alignments = [parse_links(line, path, line_no)
                  for line_no, line in enumerate(read_lines(path), start=1)]
    return [flip(links) for links in alignments] if reverse else alignments


def iter_pharaoh(path: str) -> Iterator[Alignment]:
    """:func:`read_pharaoh` (source–target files) one line at a time, from a file."""
    for line_no, line in enumerate(iter_lines(path), start=1):
        yield parse_links(line, path, line_no)


def _parse_talp_line(text: str, name: str, line_no: int) -> GoldAlignment:
    if not _GOLD_LINE.fullmatch(text):
        for token in tokenize_line(text):
            if _GOLD_LINK.fullmatch(token) is None:
                raise AlignerError(f"{name}:{line_no}: malformed gold link '{token}' "
                                   "(expected i-j for sure, ipj or i?j for possible)")
    sure, possible = set(), set()
    for i, kind, j in _GOLD_LINK.findall(text):
        link = (int(i), int(j))
        possible.add(link)
        if kind == "-":
            sure.add(link)
    return GoldAlignment(sure, possible)


def _read_naacl(path: str, n_sentences: Optional[int]) -> List[GoldAlignment]:
    """NAACL/WPT: ``sentence source target [S|P] [confidence]``, 1-based, 0 = NULL."""
    links = []  # (sentence index, link, sure)
    for line_no, line in enumerate(read_lines(path), start=1):
        fields = tokenize_line(line)
        if not fields:
            continue
        where = f"{path}:{line_no}"
        check_condition(3 <= len(fields) <= 5, f"{where}: malformed gold line '{line.strip()}' "
                                               "(expected: sentence source target [S|P])")
        check_condition(all(_NUMBER.fullmatch(f) for f in fields[:3]),
                        f"{where}: malformed gold line '{line.strip()}' "
                        "(sentence and positions must be non-negative integers)")
        sentence, src, tgt = (int(f) for f in fields[:3])
        label = fields[3] if len(fields) > 3 else "S"
        check_condition(label in ("S", "P"), f"{where}: unknown link label '{label}' "
                                             "(expected S or P)")
        if len(fields) == 5:
            try:
                float(fields[4])
            except ValueError:
                raise AlignerError(f"{where}: malformed confidence '{fields[4]}'") from None
        check_condition(sentence >= 1, f"{where}: sentence numbers start at 1, got 0")
        if n_sentences is not None:
            check_condition(sentence <= n_sentences,
                            f"{where}: sentence {sentence} beyond the {n_sentences} sentence "
                            "pairs expected")
        if src == 0 or tgt == 0:  # a NULL link: not a word-to-word link
            continue
        links.append((sentence - 1, (src - 1, tgt - 1), label == "S"))
    if n_sentences is None:
        n_sentences = max((sentence for sentence, _, _ in links), default=-1) + 1
    check_condition(n_sentences > 0, f"{path}: no links and no sentence count given")
    gold = [GoldAlignment() for _ in range(n_sentences)]
    for sentence, link, sure in links:
        gold[sentence].possible.add(link)
        if sure:
            gold[sentence].sure.add(link)
    return gold


def read_gold(path: str, gold_format: str = "talp",
              n_sentences: Optional[int] = None) -> List[GoldAlignment]:
    """Read gold alignments, one :class:`GoldAlignment` per sentence pair (0-based links).

    ``talp``: a Pharaoh-style line per sentence pair, ``i-j`` sure, ``ipj`` or ``i?j`` possible.
    ``naacl``: ``sentence source target [S|P] [confidence]`` lines, 1-based, NULL (0) dropped,
    no label = sure. Sentence ``k`` (1-based) becomes entry ``k - 1``; as sentences without
    links do not appear, give ``n_sentences`` (the hypothesis line count) to fix the length,
    otherwise it is the largest sentence number. For ``talp``, a given ``n_sentences`` must
    equal the number of lines.
    """
    check_condition(gold_format in GOLD_FORMATS, f"unknown gold format '{gold_format}' "
                                                 f"(expected one of {', '.join(GOLD_FORMATS)})")
    if gold_format == "naacl":
        return _read_naacl(path, n_sentences)
    gold = [_parse_talp_line(line, path, line_no)
            for line_no, line in enumerate(read_lines(path), start=1)]
    if n_sentences is not None and len(gold) != n_sentences:
        raise AlignerError(f"{path}:{min(len(gold), n_sentences) + 1}: line counts differ: "
                           f"{path} has {len(gold)} lines, expected {n_sentences} "
                           "(one per sentence pair)")
    return gold


def format_links(links: Iterable[Link]) -> str:
    """Pharaoh text of a link set, sorted by source then target index: ``"0-0 1-2"``."""
    return " ".join(f"{i}-{j}" for i, j in sorted(set(links)))


def format_gold(gold: GoldAlignment) -> str:
    """talp text of a gold alignment: ``i-j`` for sure, ``ipj`` for possible-only links."""
    return " ".join(f"{i}-{j}" if (i, j) in gold.sure else f"{i}p{j}"
                    for i, j in sorted(gold.possible))


def write_pharaoh(path: Optional[str], alignments: Iterable[Iterable[Link]]) -> None:
    """Write one Pharaoh line per alignment (empty line for no links), atomically.

    ``path`` None or ``"-"`` writes to stdout.
    """
    with atomic_output(path) as handle:
        for links in alignments:
            handle.write(format_links(links) + "\n")


def check_links_in_range(links: Iterable[Link], src_len: int, tgt_len: int,
                         name: str, line_no: int, reverse: bool = False) -> None:
    """Raise AlignerError when a link points outside a ``src_len`` × ``tgt_len`` sentence pair.

    ``links`` are source–target; ``reverse=True`` quotes them target–source in the message,
    as they were written in a reversed file.
    """
    for i, j in sorted(links):
        if i >= src_len or j >= tgt_len:
            written = f"{j}-{i}" if reverse else f"{i}-{j}"
            raise AlignerError(f"{name}:{line_no}: link '{written}' outside the sentence pair "
                               f"(source has {src_len} words, target has {tgt_len})")


def check_alignments_against_bitext(alignments: Sequence[Iterable[Link]], name: str,
                                    bitext: Bitext, reverse: bool = False) -> None:
    """Check line count and every link index of a corpus of alignments against its bitext.

    ``alignments`` are source–target; ``reverse`` only changes how messages quote a link.
    """
    check_same_length(bitext.source_name, len(bitext), name, len(alignments))
    for line_no, (links, src, tgt) in enumerate(zip(alignments, bitext.source, bitext.target),
                                                start=1):
        check_links_in_range(links, len(src), len(tgt), name, line_no, reverse)
