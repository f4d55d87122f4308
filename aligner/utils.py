"""Shared helpers without torch: the user-error type and atomic output files."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
from typing import IO, Iterator, Optional


class AlignerError(Exception):
    """A user error (bad input, bad option). The CLI prints it as one line and exits non-zero."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (at most 200 characters; may be empty), for
    one-line error messages."""
    lines = str(error).splitlines()
    return lines[0][:200] if lines else ""


def check_condition(condition: bool, message: str) -> None:
    """Raise AlignerError(message) unless condition holds."""
    if not condition:
        raise AlignerError(message)


@contextlib.contextmanager
def atomic_output(path: Optional[str], mode: str = "w") -> Iterator[IO]:
    """Open `path` for writing so that it appears only when complete.

    Writes to a temporary file in the same directory and renames it over `path` when the
    block exits without error; on error the temporary file is removed and `path` is untouched.
    `path` None or "-" yields stdout (text mode only; binary raises AlignerError). An OSError
    creating the temporary file or renaming it over `path` (read-only or immutable directory
    or file) is raised as one AlignerError naming `path`; see also :func:`check_writable`,
    which commands call before their work.
    """
    if path is None or path == "-":
        check_condition("b" not in mode, "binary output cannot go to stdout ('-'): give a "
                                         "file name")
        yield sys.stdout
        sys.stdout.flush()
        return
    directory = os.path.dirname(os.path.abspath(path))
    check_condition(os.path.isdir(directory), f"{path}: output directory does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                                   dir=directory)
    except OSError as error:
        raise AlignerError(f"{path}: cannot write a file in {directory}: "
                           f"{error.strerror or error}") from None
    try:
        os.chmod(tmp, 0o666 & ~_current_umask())  # mkstemp makes 0600; use the usual mode
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            yield handle
        try:
            os.replace(tmp, path)
        except OSError as error:
            raise AlignerError(f"{path}: cannot replace the file: "
                               f"{error.strerror or error}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def check_writable(path: Optional[str], option: str = "-o") -> None:
    """Raise AlignerError unless :func:`atomic_output` can write `path` (None or "-": stdout).

    Checked before a command does its work, so that an unwritable output fails in a second,
    not after the work: the directory must exist and be writable (not read-only, not
    immutable), and an existing `path` must be a writable file (not a directory, not
    read-only or immutable). `option` names the option in the message.
    """
    if path is None or path == "-":
        return
    directory = os.path.dirname(os.path.abspath(path))
    check_condition(os.path.isdir(directory), f"{path}: output directory does not exist")
    check_condition(not os.path.isdir(path), f"{path}: {option} is a directory, not a file")
    check_condition(os.access(directory, os.W_OK | os.X_OK),
                    f"{path}: cannot write in directory {directory} (read-only or immutable)")
    check_condition(not os.path.exists(path) or os.access(path, os.W_OK),
                    f"{path}: output file is not writable (read-only or immutable)")


def _current_umask() -> int:
    """The process umask (read by setting and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside the block, SIGTERM (``kill PID``, a job scheduler) raises AlignerError in the main
    thread instead of ending the process on the spot, so that ``finally`` blocks run: worker
    processes are stopped instead of left running as orphans. The previous handler is restored
    on exit; outside the main thread this does nothing (signals reach only the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: object) -> None:
        raise AlignerError("terminated (SIGTERM); worker processes stopped")

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
