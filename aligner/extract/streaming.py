"""Streaming input of `align extract`: sentence pairs from a pipe or a terminal, in batches
formed from what has already arrived.

``align extract MODEL -i - -o -`` inside a long-running process (a pipeline that sends one
pair at a time and waits for its alignment) must not wait for the end of its input, as the
block path (10,000 lines a block) does. When an input is a pipe, a FIFO or a terminal (not a
regular file), the pairs are read from the file descriptors as they come: a batch starts
with the first complete pair, takes every pair that arrives within :data:`WAIT_SECONDS`
(50 ms) of it and every pair already readable then (never waiting longer), at most
:data:`MAX_BATCH_LINES`, and is aligned and written (and flushed) before the next is read. So a single pair waits at most 50 ms before its alignment starts,
and a fast producer (``cat big.txt |``) still gets batches of many pairs. The output is the
same, line for line, as the block path's for the same lines.

Input errors are those of :func:`aligner.formats.read_bitext` (file:line: not UTF-8, a
missing ``|||``, an input without any line, line counts that differ), raised when the line
arrives, after the lines before it were written. Uses ``select`` on the descriptors: Unix.
"""
from __future__ import annotations

import contextlib
import os
import select
import stat
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import IO, Any, Deque, Iterator, List, Optional, Sequence, Tuple

from aligner.formats import GZIP_MAGIC, Bitext, gzip_on_a_pipe, joint_sides, tokenize_line
from aligner.utils import AlignerError, atomic_output, check_condition

#: longest wait, after the first pair of a batch has arrived, for more pairs to join it
WAIT_SECONDS = 0.05
#: most pairs in one batch (a producer faster than the aligner fills batches to this): the
#: block size of the file path (aligner.extract.inference.BLOCK_LINES), so memory stays bounded
#: alike
MAX_BATCH_LINES = 10_000
READ_SIZE = 1 << 16
_BOM = b"\xef\xbb\xbf"


def is_stream(path: Optional[str]) -> bool:
    """True when `path` ("-" = standard input) is a pipe, FIFO, socket or terminal: read as
    a stream. False for a regular file (including ``-`` redirected from one: ``< file``),
    a missing file (reading it gives the usual error) and None."""
    if path is None:
        return False
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode if path == "-" else os.stat(path).st_mode
    except (OSError, ValueError, AttributeError):
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def streams(source: Optional[str], target: Optional[str], joint: Optional[str]) -> bool:
    """Whether `align extract` reads these inputs as streams (any of them is one)."""
    return any(is_stream(path) for path in (source, target, joint))


class LineSource:
    """The lines of one file descriptor as they arrive: raw ``os.read`` calls (no buffered
    reader that would wait for a full buffer), complete lines decoded and queued."""

    def __init__(self, path: str, fd: Optional[int] = None) -> None:
        """`path`: a file name, or "-" for standard input; `fd`: an open descriptor to read
        instead (`path` then only names it in messages; not closed here)."""
        self.name = path
        self.owned = fd is None and path != "-"
        if fd is None:
            fd = sys.stdin.fileno() if path == "-" else _open(path)
        self.fd = fd
        self.lines: Deque[str] = deque()
        self.partial = b""
        self.eof = False
        self.read_lines = 0   # lines decoded so far (the number of the last one)
        #: a line that is not UTF-8 ends the source: raised once the lines before it are used
        self.error: Optional[AlignerError] = None

    def fileno(self) -> int:
        return self.fd

    def fill(self) -> None:
        """One read (blocking until data or EOF); queues the complete lines it ends."""
        try:
            data = os.read(self.fd, READ_SIZE)
        except OSError as error:
            raise AlignerError(f"{self.name}: cannot read: {error.strerror}") from None
        if not data:
            self.eof = True
            if self.partial:   # a last line without "\n"
                self._queue(self.partial)
                self.partial = b""
            # (a last line that was refused, e.g. gzip data without a newline byte, is the
            # error to report, not an empty file)
            check_condition(self.read_lines > 0 or self.error is not None,
                            f"{self.name}: empty file")
            return
        *complete, self.partial = (self.partial + data).split(b"\n")
        for raw in complete:
            self._queue(raw)
            if self.error is not None:
                self.eof, self.partial = True, b""
                return

    def _queue(self, raw: bytes) -> None:
        if self.read_lines == 0 and raw.startswith(GZIP_MAGIC):
            self.error = AlignerError(gzip_on_a_pipe(self.name))
            return
        if self.read_lines == 0 and raw.startswith(_BOM):
            raw = raw[len(_BOM):]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        self.read_lines += 1
        try:
            self.lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            self.error = AlignerError(f"{self.name}:{self.read_lines}: not valid UTF-8 (byte "
                                      f"0x{raw[error.start]:02x} at column {error.start + 1})")

    def close(self) -> None:
        if self.owned:
            os.close(self.fd)


def _open(path: str) -> int:
    check_condition(os.path.exists(path), f"{path}: no such file")
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as error:
        raise AlignerError(f"{path}: cannot read: {error.strerror}") from None


@dataclass
class StreamBitext:
    """A bitext read from streams: one joint ``source ||| target`` source, or a source and a
    target source read side by side. Iterate :meth:`batches`."""

    sources: Sequence[LineSource]
    wait: float = WAIT_SECONDS
    max_lines: int = MAX_BATCH_LINES

    @classmethod
    def open(cls, source: Optional[str], target: Optional[str], joint: Optional[str],
             wait: float = WAIT_SECONDS, max_lines: int = MAX_BATCH_LINES) -> "StreamBitext":
        paths = [joint] if joint is not None else [source, target]
        check_condition(all(path is not None for path in paths),
                        "give source and target files (-s and -t) or one joint file (-i)")
        check_condition(paths.count("-") <= 1, "only one input can be standard input ('-')")
        return cls([LineSource(path) for path in paths], wait, max_lines)  # type: ignore

    @property
    def source_name(self) -> str:
        return self.sources[0].name

    @property
    def target_name(self) -> str:
        return self.sources[-1].name

    def _available(self) -> int:
        return min(len(s.lines) for s in self.sources)

    def _open_sources(self) -> List[LineSource]:
        return [s for s in self.sources if not s.eof]

    def _read(self, timeout: Optional[float]) -> bool:
        """Read from every source with data within `timeout` seconds (None: wait until one
        has data or ends); False when nothing came in time."""
        pending = [s for s in self._open_sources()
                   if len(s.lines) == min(len(t.lines) for t in self.sources)]
        pending = pending or self._open_sources()
        ready, _, _ = select.select(pending, [], [], timeout)
        for s in ready:
            s.fill()
        return bool(ready)

    def _check_ended(self) -> None:
        """A source's bad line is raised when the lines before it are used up; both sides of
        a side-by-side bitext must end together."""
        for s in self.sources:
            if s.error is not None and len(s.lines) == self._available() == 0:
                raise s.error
        if len(self.sources) == 2:
            short, long = sorted(self.sources, key=lambda s: len(s.lines))
            if short.eof and short.error is None and not short.lines and long.lines:
                raise AlignerError(f"{long.name}:{short.read_lines + 1}: line counts differ: "
                                   f"{short.name} has {short.read_lines} lines, {long.name} "
                                   f"has more")

    def batches(self) -> Iterator[Bitext]:
        """Bitexts of the pairs that have arrived (see the module docstring), each knowing
        the input line number of its first pair, until every source has ended."""
        first_line = 1
        while True:
            while self._available() == 0 and self._open_sources():
                self._check_ended()
                self._read(None)
            self._check_ended()
            if self._available() == 0:
                return
            # take what is readable now, waiting for more until `wait` after the first pair
            deadline = time.monotonic() + self.wait
            while self._available() < self.max_lines and self._open_sources():
                if not self._read(max(0.0, deadline - time.monotonic())):
                    break
            self._check_ended()
            count = min(self._available(), self.max_lines)
            batch, error = self._take(count, first_line)
            first_line += count
            if len(batch):
                yield batch
            if error is not None:   # after the lines before the bad one were written
                raise error

    def _take(self, count: int, first_line: int) -> Tuple[Bitext, Optional[AlignerError]]:
        """The next `count` pairs as a Bitext, and the error of a malformed line among them
        (the Bitext then ends before it)."""
        sources: List[List[str]] = []
        targets: List[List[str]] = []
        error = None
        for n in range(first_line, first_line + count):
            if len(self.sources) == 1:
                try:
                    src, tgt = joint_sides(self.sources[0].lines.popleft(), self.source_name,
                                            n)
                except AlignerError as bad_line:
                    error = bad_line
                    break
            else:
                src = tokenize_line(self.sources[0].lines.popleft())
                tgt = tokenize_line(self.sources[1].lines.popleft())
            sources.append(src)
            targets.append(tgt)
        return Bitext(sources, targets, self.source_name, self.target_name, first_line), error

    def close(self) -> None:
        for s in self.sources:
            s.close()



@contextlib.contextmanager
def optional_output(path: Optional[str], mode: str = "w") -> Iterator[Optional[IO]]:
    """:func:`aligner.utils.atomic_output` of `path`, or None when there is no `path` (an
    option not given; atomic_output(None) would be stdout)."""
    if path is None:
        yield None
        return
    with atomic_output(path, mode) as handle:
        yield handle


def stream_extract(extraction: Any, source: Optional[str], target: Optional[str],
                   joint: Optional[str], output: str, link_probs: Optional[str],
                   inline: bool, wait: float = WAIT_SECONDS) -> Tuple[int, int]:
    """`align extract` on streamed input: every batch of :meth:`StreamBitext.batches` is
    aligned by `extraction` (an aligner.extract.corpus_alignment.Extraction, through the same
    :func:`~aligner.extract.corpus_alignment.lines_of_block` as a block of a file), written and
    flushed before the next is read (stdout at once; a regular -o or --link-probs file
    appears, atomically, at the end); `wait`: see :data:`WAIT_SECONDS`. Returns (pairs,
    links)."""
    from aligner.extract.corpus_alignment import (PROBS, encode_block, encode_mix_block,
                                                  lines_of_block)
    from aligner.extract.inference import DirectionWorkers

    n_pairs = n_links = 0
    names = [extraction.main] + ([PROBS] if link_probs is not None else [])
    bitext = StreamBitext.open(source, target, joint, wait)
    try:
        # the two direction processes start only for a batch of 1,000+ pairs (a fast
        # producer), as in the block path; then they serve every later batch
        with atomic_output(output) as out, optional_output(link_probs) as probs_out, \
                DirectionWorkers() as workers:
            for batch in bitext.batches():
                pairs = encode_block(extraction, batch)
                lines, hard, _ = lines_of_block(extraction, pairs, names, inline,
                                                workers=workers,
                                                mix_pairs=encode_mix_block(extraction, batch,
                                                                           pairs))
                out.writelines(lines[extraction.main])
                out.flush()
                if probs_out is not None:
                    probs_out.writelines(lines[PROBS])
                    probs_out.flush()
                n_pairs += len(pairs)
                n_links += sum(map(len, hard[extraction.main]))
    finally:
        bitext.close()
    return n_pairs, n_links
