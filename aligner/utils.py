"""Shared helpers without torch: the user-error type and atomic output files."""
from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import stat
import sys
import tempfile
import threading
from typing import IO, Callable, Dict, Iterator, Optional


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


#: errno values of a write that failed for want of room: full disk, quota, file size limit
WRITE_FAILURES = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)
#: what each of :data:`WRITE_FAILURES` means for the user
_WRITE_FAILURE_HINTS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is "
                        "used up", errno.EFBIG: "over the limit on file sizes: ulimit -f, or "
                        "the file system's",
                        errno.EIO: "an input/output error of the device"}
#: numpy's message for a short write of ndarray.tofile / np.save to a real file (no errno):
#: "13609 requested and 8160 written"
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def write_failure(error: BaseException) -> Optional[str]:
    """'What the OS said (what it means)' when `error` is a write that failed for want of room
    (:data:`WRITE_FAILURES`, or numpy's short write, which carries no errno), else None."""
    if not isinstance(error, OSError):
        return None
    if error.errno in WRITE_FAILURES:
        return f"{error.strerror or first_line(error)} ({_WRITE_FAILURE_HINTS[error.errno]})"
    if error.errno is None and _SHORT_WRITE.fullmatch(str(error).strip()):
        return (f"only part of the data was written ({error}): the disk is full, or the "
                f"file is over the limit on file sizes")
    return None


def os_error_message(error: OSError) -> str:
    """One line for an OSError: 'PATH: what the OS said' (just what it said when the error
    names no file), with what a full disk, a quota or a file size limit means."""
    reason = (write_failure(error) or error.strerror or first_line(error)
              or type(error).__name__)
    return f"{error.filename}: {reason}" if error.filename is not None else reason


def open_no_follow(path: str, flags: int, what: str) -> int:
    """os.open(path, flags | O_NOFOLLOW | O_CREAT, 0o666 less the umask): a file of a model
    directory that a symbolic link must not redirect (its target would be overwritten). One
    AlignerError naming `path` and `what` it is when it cannot be opened."""
    try:
        return os.open(path, flags | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as error:
        reason = (f"a symbolic link (the {what} is a plain file: remove the link)"
                  if os.path.islink(path) else error.strerror)
        raise AlignerError(f"{path}: cannot open the {what}: {reason}") from None


def is_special_file(path: str) -> bool:
    """Whether `path` is an existing character device or FIFO (/dev/null, a named pipe), or
    anything under /dev or /proc (/dev/stdout links to whatever stdout is, a regular file too):
    such an output is written in place, never replaced by a regular file."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    system = ("/dev/", "/proc/")
    return (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)
            or os.path.abspath(path).startswith(system)
            or (os.path.islink(path) and os.readlink(path).startswith(system)))


@contextlib.contextmanager
def atomic_output(path: Optional[str], mode: str = "w",
                  before_replace: Optional[Callable[[], None]] = None) -> Iterator[IO]:
    """Open `path` for writing so that it appears only when complete.

    Writes to a temporary file in the same directory and renames it over `path` when the
    block exits without error; on error the temporary file is removed and `path` is untouched.
    `path` None or "-" yields stdout (text mode only; binary raises AlignerError). An existing
    character device or FIFO (/dev/null, a named pipe) is written in place: the rename would
    replace it with a regular file. An OSError creating the temporary file, writing it (a full
    disk) or renaming it over `path` (read-only or immutable directory or file) is raised as
    one AlignerError naming `path`; see also :func:`check_writable`, which commands call before
    their work. `before_replace`: called once the new content is complete, just before it
    replaces `path`.
    """
    if path is None or path == "-":
        check_condition("b" not in mode, "binary output cannot go to stdout ('-'): give a "
                                         "file name")
        yield sys.stdout
        sys.stdout.flush()
        return
    encoding = None if "b" in mode else "utf-8"
    if is_special_file(path):
        with _write_errors_named(path):
            with open(path, mode, encoding=encoding) as handle:
                yield handle
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
        with _write_errors_named(path):
            with os.fdopen(fd, mode, encoding=encoding) as handle:
                yield handle
        if before_replace is not None:
            before_replace()
        try:
            os.replace(tmp, path)
        except OSError as error:
            raise AlignerError(f"{path}: cannot replace the file: "
                               f"{error.strerror or error}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


#: the temporary file of :func:`atomic_output` for "name": ".name.XXXXXXXX.tmp"
_TEMPORARY = re.compile(r"\..+\.[A-Za-z0-9_]{8}\.tmp")


def remove_stale_temporaries(directory: str) -> int:
    """Remove the temporary files :func:`atomic_output` left in `directory` when its process
    was killed (SIGKILL, power loss) before it could remove them; call it only where no other
    process writes (a model directory whose run lock is held). Returns how many were removed."""
    removed = 0
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            if _TEMPORARY.fullmatch(name) and os.path.isfile(path) and not os.path.islink(path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    removed += 1
    return removed


@contextlib.contextmanager
def write_errors_named(path: str) -> Iterator[None]:
    """A write that failed for want of room (:data:`WRITE_FAILURES`: a full disk, a quota, a
    file size limit; or numpy's short write) inside the block becomes one AlignerError naming
    `path`: 'PATH: cannot write: No space left on device (the disk is full)'. For a write into
    a model directory that does not go through :func:`atomic_output`."""
    try:
        yield
    except OSError as error:
        reason = write_failure(error)
        if reason is None:
            raise
        raise AlignerError(f"{path}: cannot write: {reason}") from None


_write_errors_named = write_errors_named


def check_writable(path: Optional[str], option: str = "-o") -> None:
    """Raise AlignerError unless :func:`atomic_output` can write `path` (None or "-": stdout).

    Checked before a command does its work, so that an unwritable output fails in a second,
    not after the work: the directory must exist and be writable (not read-only, not
    immutable), and an existing `path` must be a writable file (not a directory, not
    read-only or immutable); an empty name ('') is refused. `option` names the option in the
    message.
    """
    if path is None or path == "-":
        return
    check_condition(path != "", f"{option}: empty file name")
    if is_special_file(path):   # written in place: only the file itself must be writable
        check_condition(os.access(path, os.W_OK), f"{path}: {option} is not writable")
        return
    directory = os.path.dirname(os.path.abspath(path))
    check_condition(os.path.isdir(directory), f"{path}: output directory does not exist")
    check_condition(not os.path.isdir(path), f"{path}: {option} is a directory, not a file")
    check_condition(os.access(directory, os.W_OK | os.X_OK),
                    f"{path}: cannot write in directory {directory} (read-only or immutable)")
    check_condition(not os.path.exists(path) or os.access(path, os.W_OK),
                    f"{path}: output file is not writable (read-only or immutable)")


def same_file(first: str, second: str) -> bool:
    """Whether two paths name one file (the same inode when both exist, else the same
    resolved path)."""
    try:
        return os.path.samefile(first, second)
    except OSError:
        return os.path.realpath(first) == os.path.realpath(second)


def check_distinct_files(inputs: Dict[str, Optional[str]],
                         outputs: Dict[str, Optional[str]]) -> None:
    """Refuse (one line, before any work) an output that names one of the inputs (it would
    be replaced) or the same file as another output (one would overwrite the other). Keys
    are the options that name the files; None and "-" (stdin/stdout) are skipped, and so are
    outputs written in place (:func:`is_special_file`: /dev/null may be an input and two
    outputs at once, a terminal both /dev/stdin and /dev/stdout)."""
    files = [(option, path) for option, path in outputs.items()
             if path is not None and path != "-" and not is_special_file(path)]
    for option, path in files:
        for input_option, input_path in inputs.items():
            if input_path is None or input_path == "-":
                continue
            check_condition(not same_file(path, input_path),
                            f"{path}: {option} names the input file of {input_option}: it "
                            f"would be replaced; give another output file")
    for k, (option, path) in enumerate(files):
        for other_option, other in files[k + 1:]:
            check_condition(not same_file(path, other),
                            f"{path}: {option} and {other_option} name the same file; give "
                            f"each output its own")


def inside_directory(path: str, directory: str) -> bool:
    """Whether `path` lies inside `directory` (or is it), symbolic links resolved on both
    sides: ``out -> model/config.json`` and ``link/config.json`` for ``link -> model`` are
    inside ``model``."""
    parent, name = os.path.split(os.path.abspath(path))
    pairs = ((os.path.realpath(path), os.path.realpath(directory)),   # links followed
             (os.path.join(os.path.realpath(parent), name), os.path.realpath(directory)),
             (os.path.abspath(path), os.path.abspath(directory)))     # as written
    return any(os.path.commonpath([home, candidate]) == home for candidate, home in pairs)


def check_outside_model_dir(model_dir: Optional[str], outputs: Dict[str, Optional[str]]
                            ) -> None:
    """Refuse (one line, before any work) an output inside the model directory that the
    command reads or writes: it would replace one of the model's files (config.json, the
    weights, the vocabularies) or land among them. Keys are the options that name the files;
    None, "-" and outputs written in place (:func:`is_special_file`) are skipped."""
    if model_dir is None:
        return
    for option, path in outputs.items():
        if not path or path == "-" or is_special_file(path):   # '': check_writable's
            continue
        check_condition(not inside_directory(path, model_dir),
                        f"{path}: {option} lies inside the model directory {model_dir}: it "
                        f"could replace the model's own files; write it elsewhere")


def _current_umask() -> int:
    """The process umask (read by setting and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class Terminated(AlignerError):
    """SIGTERM (``kill PID``, a job scheduler, ``timeout``) arrived inside
    :func:`sigterm_raises`; a command may catch it to say what was kept or removed."""


#: how many :func:`sigterm_raises` blocks the main thread is in, and whether SIGTERM has been
#: raised in them already (a second SIGTERM, as a scheduler may send, must not cut off the
#: clean-up the first one started)
_sigterm = {"depth": 0, "raised": False}


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside the block, SIGTERM (``kill PID``, a job scheduler) raises :class:`Terminated` (an
    AlignerError: one line, exit status 1) in the main thread instead of ending the process on
    the spot, so that ``finally`` blocks run: worker processes are stopped instead of left
    running as orphans, temporary directories are removed. Only the first SIGTERM raises;
    later ones, while that one's clean-up runs, are ignored. Blocks nest; the previous handler
    is restored on exit; outside the main thread this does nothing (signals reach only the main
    thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: object) -> None:
        if _sigterm["raised"]:
            return
        _sigterm["raised"] = True
        raise Terminated("terminated (SIGTERM); worker processes stopped")

    previous = signal.signal(signal.SIGTERM, terminated)
    _sigterm["depth"] += 1
    try:
        yield
    finally:
        _sigterm["depth"] -= 1
        if _sigterm["depth"] == 0:
            _sigterm["raised"] = False
        signal.signal(signal.SIGTERM, previous)
