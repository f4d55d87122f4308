"""Shared test fixtures: paths to the shipped sample and the shared real data."""
from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_DATA = ROOT / "tests" / "data"
SAMPLE = ROOT / "data" / "sample"
# Real gold sets and bitext live beside the checkout (never inside it); absent for users.
SHARED_DATA = Path(os.environ.get("ALIGNER_SHARED_DATA", ROOT.parent / "shared" / "data"))


def _limit_threads() -> None:
    """Tests run on 2-core CI machines: one intra-op thread keeps parallel runs predictable.
    ALIGNER_TEST_THREADS=N runs the suite with N threads instead (the suite must pass with any
    count: a sum in another order rounds differently)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard requirement, but keep collection alive
        return
    torch.set_num_threads(int(os.environ.get("ALIGNER_TEST_THREADS", "1")))


_limit_threads()


@pytest.fixture
def shared_data() -> Path:
    """The shared real-data folder; skips the test when it is absent (as it is for users)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@contextlib.contextmanager
def restored_aligner_logger():
    """Undo, on exit, what a command's setup_logging did to the global ``aligner`` logger.

    Commands run in-process through CliRunner set ``propagate = False`` and attach their own
    handlers (right for a CLI); without this, later tests' ``caplog`` would see nothing.
    Module-scoped fixtures that run commands need it too: they are set up before the
    per-test fixture below takes its snapshot.
    """
    logger = logging.getLogger("aligner")
    handlers, propagate, level = list(logger.handlers), logger.propagate, logger.level
    try:
        yield
    finally:
        for handler in list(logger.handlers):
            if handler not in handlers:
                logger.removeHandler(handler)
                handler.close()
        logger.propagate, logger.level = propagate, level


def cut_off_at_checkpoint(n: int):
    """Inside the block, the `n`-th checkpoint a Trainer writes (counted from the block's
    start) is written, and then the run is cut off by KeyboardInterrupt, as a Ctrl-C right
    after it would (aligner/faults.py's public point)."""
    from aligner import faults

    return faults.injected("checkpoint", n)


@pytest.fixture(autouse=True)
def _restore_aligner_logger():
    with restored_aligner_logger():
        yield
