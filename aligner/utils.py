"""Shared helpers without torch: the user-error type and atomic output files."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import IO, Iterator, Optional


class AlignerError(Exception):
    """A user error (bad input, bad option). The CLI prints it as one line and exits non-zero."""


def check_condition(condition: bool, message: str) -> None:
    """Raise AlignerError(message) unless condition holds."""
    if not condition:
        raise AlignerError(message)


@contextlib.contextmanager
def atomic_output(path: Optional[str], mode: str = "w") -> Iterator[IO]:
    """Open `path` for writing so that it appears only when complete.

    Writes to a temporary file in the same directory and renames it over `path` when the
    block exits without error; on error the temporary file is removed and `path` is untouched.
    `path` None or "-" yields stdout (text mode only).
    """
    if path is None or path == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    directory = os.path.dirname(os.path.abspath(path))
    check_condition(os.path.isdir(directory), f"{path}: output directory does not exist")
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                               dir=directory)
    try:
        os.chmod(tmp, 0o666 & ~_current_umask())  # mkstemp makes 0600; use the usual mode
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _current_umask() -> int:
    """The process umask (read by setting and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
