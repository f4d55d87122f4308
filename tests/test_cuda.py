"""The CUDA path on a real GPU: skipped where torch sees none (CI, most machines); run them
where one is lent with ``pytest -m cuda``. What the CPU suite cannot show:

* no host synchronisation per update: training 30 updates synchronises with the GPU exactly as
  often as training 10 (torch.cuda.set_sync_debug_mode counts them), so the only syncs are
  at start, log, checkpoint and end (aligner/training/loop.py);
* ``--deterministic`` on CUDA: two runs give the same weights bit for bit, and so does a run
  cut off after its first checkpoint and resumed (README's bit-identical resume);
* bf16 autocast on CUDA against fp32 on a 150 x 150 pair is in tests/test_bf16_long.py (its
  device parameter).

Each training here is a fresh ``python -m aligner`` process, as a user's would be:
``--deterministic`` must set CUBLAS_WORKSPACE_CONFIG before CUDA starts, and
``torch.use_deterministic_algorithms`` is global to a process.
"""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from aligner import constants as C
from cli_runner import run
from synthetic import monotone_corpus, write_corpus

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO = Path(__file__).resolve().parents[1]
#: a small hmm1 (the recipe's kind, its linear lexicon) trained on CUDA in one direction
HMM1 = ["--model", "hmm1", "--rounds", "1", "--directions", "fwd", "--bpe-merges", "40",
        "--d-model", "32", "--heads", "2", "--encoder-layers", "1", "--decoder-layers", "1",
        "--ff-dim", "64", "--max-tokens", "300", "--warmup", "2", "--lr", "3e-3",
        "--device", "cuda", "-q"]


@pytest.fixture
def bitext(tmp_path):
    sources, targets, golds = monotone_corpus(60, seed=5)
    src, tgt, _ = write_corpus(tmp_path, "train", sources, targets, golds)
    return ["-s", src, "-t", tgt]


def _sync_sites(args) -> collections.Counter:
    """Where (file:line) `align ARGS` synchronised the host with the GPU, and how often."""
    sites: collections.Counter = collections.Counter()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run(*args)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for warning in caught:
        if "synchronizing CUDA operation" in str(warning.message):
            sites[f"{os.path.relpath(warning.filename, REPO)}:{warning.lineno}"] += 1
    return sites


def test_training_updates_do_not_synchronise_with_the_gpu(tmp_path, bitext):
    """30 updates synchronise as often as 10, at the same places: no update waits for the
    GPU (log interval 100 and one checkpoint at the end: both runs log and save alike)."""
    base = ["train", *bitext, *HMM1, "--checkpoint-interval", "1000"]
    run(*base, "-o", tmp_path / "warm", "--max-updates", "3")     # CUDA, kernels loaded
    short = _sync_sites([*base, "-o", tmp_path / "short", "--max-updates", "10"])
    long = _sync_sites([*base, "-o", tmp_path / "long", "--max-updates", "30"])
    assert sum(short.values()) > 0     # the checkpoint's copies to the host are seen
    assert long - short == collections.Counter(), f"per-update syncs at {dict(long - short)}"


def _train(model_dir: Path, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aligner", "train", *map(str, args),
                           "-o", str(model_dir)], cwd=REPO, env={**os.environ, **(env or {})},
                          capture_output=True, text=True)


def _same_weights(a: Path, b: Path) -> bool:
    """The two runs' params.best.pt are the same bytes (the same tensors, saved alike)."""
    return (a / "fwd" / C.PARAMS_BEST).read_bytes() == (b / "fwd" / C.PARAMS_BEST).read_bytes()


def test_deterministic_training_and_resume_are_bit_identical(tmp_path, bitext):
    args = [*bitext, *HMM1, "--max-updates", "16", "--checkpoint-interval", "8",
            "--deterministic"]
    for name in ("a", "b"):
        done = _train(tmp_path / name, *args)
        assert done.returncode == 0, done.stderr[-2000:]
    assert _same_weights(tmp_path / "a", tmp_path / "b")
    cut = _train(tmp_path / "cut", *args, env={"ALIGNER_FAULT": "checkpoint:1"})
    assert cut.returncode == -signal.SIGKILL        # killed after the checkpoint of update 8
    resumed = _train(tmp_path / "cut", *args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _same_weights(tmp_path / "a", tmp_path / "cut")
