"""Shared test fixtures: paths to the shipped sample and the shared real data."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_DATA = ROOT / "tests" / "data"
SAMPLE = ROOT / "data" / "sample"
# Real gold sets and bitext live beside the checkout (never inside it); absent for users.
SHARED_DATA = Path(os.environ.get("ALIGNER_SHARED_DATA", ROOT.parent / "shared" / "data"))


def _limit_threads() -> None:
    """Tests run on 2-core CI machines: one intra-op thread keeps parallel runs predictable."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard requirement, but keep collection alive
        return
    torch.set_num_threads(1)


_limit_threads()


@pytest.fixture
def shared_data() -> Path:
    """The shared real-data folder; skips the test when it is absent (as it is for users)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA
