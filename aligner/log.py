"""Logging set-up: messages on stderr and, for training, in the model directory's train.log.

All modules log through ``logging.getLogger(__name__)`` (children of the ``aligner`` logger);
only the command functions call :func:`setup_logging`. No torch here.
"""
from __future__ import annotations

import logging
import os
import platform
import sys
from typing import Any, Dict, Optional, Sequence

from aligner import __version__
from aligner.utils import open_no_follow, write_failure

FORMAT = "[%(asctime)s %(levelname)s] %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
_HANDLER_MARK = "_aligner_handler"


def setup_logging(quiet: bool = False, verbose: bool = False, logfile: Optional[str] = None,
                  console: bool = True) -> logging.Logger:
    """Configure the ``aligner`` logger; returns it.

    quiet: console shows warnings and errors only. verbose: console shows debug messages.
    logfile: also append INFO and above to this file. console False (DDP ranks > 0): no console.
    Calling it again replaces the handlers it added before (tests call commands repeatedly).
    """
    logger = logging.getLogger("aligner")
    for handler in list(logger.handlers):
        if getattr(handler, _HANDLER_MARK, False):
            logger.removeHandler(handler)
            handler.close()
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    formatter = logging.Formatter(FORMAT, DATE_FORMAT)
    if console:
        stream = logging.StreamHandler(sys.stderr)
        stream.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
        stream.setFormatter(formatter)
        setattr(stream, _HANDLER_MARK, True)
        logger.addHandler(stream)
    if logfile is not None:
        handler = _LogFile(logfile)
        handler.setLevel(logging.DEBUG if verbose else logging.INFO)
        handler.setFormatter(formatter)
        setattr(handler, _HANDLER_MARK, True)
        logger.addHandler(handler)
    return logger


class _LogFile(logging.StreamHandler):
    """Appends to a log file opened without following a symbolic link (a link's target would
    get the log: refused, one error line); a write that fails (a full disk) is reported once
    on stderr as one line, not as a traceback per message."""

    def __init__(self, path: str):
        descriptor = open_no_follow(path, os.O_WRONLY | os.O_APPEND, "log")
        super().__init__(os.fdopen(descriptor, "a", encoding="utf-8"))
        self.path = path
        self.failed = False

    def handleError(self, record: logging.LogRecord) -> None:
        if not self.failed:
            self.failed = True
            error = sys.exc_info()[1]
            reason = (write_failure(error) if error is not None else None) or \
                getattr(error, "strerror", None) or error
            print(f"align: warning: {self.path}: cannot write the log: {reason}; later "
                  f"messages go to the console only", file=sys.stderr)

    def close(self) -> None:
        try:
            self.stream.close()
        except OSError:
            pass
        super().close()


def log_run_info(logger: logging.Logger, argv: Sequence[str],
                 settings: Optional[Dict[str, Any]] = None) -> None:
    """Log version, Python/platform, the full command line and (optionally) the settings."""
    logger.info("aligner %s, Python %s, %s", __version__, platform.python_version(),
                platform.platform())
    logger.info("command: %s", " ".join(argv))
    logger.info("working directory: %s", os.getcwd())
    if settings:
        for key in sorted(settings):
            logger.info("  %s = %s", key, settings[key])
