"""A line far too long for the model is skipped at no cost, in every output mode.

A pair of 200,000 words on each side exceeds any model's max_positions, so it gets an empty
alignment and a warning. Before, its soft matrix was still allocated as a (source words,
target words) array of zeros: 200,000² float32 is 149 GiB, a MemoryError on any machine
(the same for align run, which trained to the end and died in the final alignment). Each
output mode is run for real here: -H soft-average to -o, --soft, --link-probs, streaming from
a pipe, and torchrun with 2 processes; each writes the other lines' alignments and an empty
line (or an array without elements) for the long one.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from aligner.data import EncodedPair
from aligner.extract.inference import no_alignment
from aligner.links.soft_symmetrize import soft_average
from cli_runner import run
from conftest import ROOT
from synthetic import write_corpus
from test_api import make_model_dir
from test_blocks import _free_port

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
WORDS = 200_000
LONG = 2      # 0-based line of the long pair


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A tiny transformer model directory (max_positions 16) and 5 pairs, line 2 of 200,000
    words on each side."""
    root = tmp_path_factory.mktemp("long")
    directory, sources, targets, _ = make_model_dir(root)
    sources, targets = sources[:5], targets[:5]
    sources[LONG] = sources[0] * (WORDS // len(sources[0]) + 1)
    targets[LONG] = targets[0] * (WORDS // len(targets[0]) + 1)
    src, tgt, _ = write_corpus(root, "long", sources, targets)
    return dict(root=root, model=directory, src=src, tgt=tgt, n=len(sources),
                joint="".join(f"{' '.join(s)} ||| {' '.join(t)}\n"
                              for s, t in zip(sources, targets)))


def _check_lines(text: str, n: int, every_other: bool = True) -> None:
    """n lines, the long one empty, the others aligned (`every_other`; else some)."""
    lines = text.splitlines()
    assert len(lines) == n
    assert lines[LONG] == ""
    aligned = [bool(lines[k]) for k in range(n) if k != LONG]
    assert all(aligned) if every_other else any(aligned)


def test_no_alignment_has_no_elements_and_gives_no_links():
    long_pair = EncodedPair(np.arange(5), np.arange(5), list(range(WORDS)), list(range(WORDS)))
    assert no_alignment(long_pair).shape == (0, 0)
    empty_side = EncodedPair(np.arange(0), np.arange(3), [], [0, 1, 2])
    assert no_alignment(empty_side).shape == (0, 3)
    # soft-average of a line that one direction could not align: no links, no shape error
    assert soft_average(np.zeros((0, 0)), np.ones((2, 3))) == set()
    assert soft_average(np.ones((2, 3)), np.zeros((0, 0))) == set()


def test_soft_average_output_link_probs_and_soft_skip_the_long_line(corpus, tmp_path):
    out, probs, soft = tmp_path / "out", tmp_path / "probs", tmp_path / "soft.npz"
    run("extract", corpus["model"], "-s", corpus["src"], "-t", corpus["tgt"], "-H",
        "soft-average", "--threshold", "0.1", "-o", out, "--link-probs", probs, "--soft", soft,
        "-q")
    _check_lines(out.read_text(), corpus["n"])
    assert probs.read_text().splitlines()[LONG] == ""
    arrays = np.load(soft)
    assert arrays[f"fwd_{LONG}"].shape == arrays[f"rev_{LONG}"].shape == (0, 0)
    assert arrays["fwd_0"].size > 0


def test_block_by_block_link_probs_skip_the_long_line(corpus, tmp_path):
    out, probs = tmp_path / "out", tmp_path / "probs"
    run("extract", corpus["model"], "-s", corpus["src"], "-t", corpus["tgt"], "-H",
        "soft-average", "--threshold", "0.1", "-o", out, "--link-probs", probs,
        "--block-lines", "2", "-q")
    _check_lines(out.read_text(), corpus["n"])
    assert probs.read_text().splitlines()[LONG] == ""


def test_streaming_from_a_pipe_skips_the_long_line(corpus):
    result = subprocess.run([sys.executable, "-m", "aligner", "extract", str(corpus["model"]),
                             "-i", "-", "-o", "-", "-H", "soft-average", "--threshold", "0.1",
                             "--inline-probs"],
                            input=corpus["joint"], capture_output=True, text=True, env=ENV, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    _check_lines(result.stdout, corpus["n"])
    assert "positions > the model's limit of 16: writing an empty alignment" in result.stderr


def test_torchrun_skips_the_long_line(corpus, tmp_path):
    out = tmp_path / "dist.txt"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
               "-m", "aligner", "extract", str(corpus["model"]), "-s", str(corpus["src"]),
               "-t", str(corpus["tgt"]), "-H", "soft-average", "--threshold", "0.1",
               "--block-lines", "2", "-q", "-o", str(out)]
    result = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    _check_lines(out.read_text(), corpus["n"])


def test_align_run_trains_and_aligns_around_the_long_line(tmp_path):
    """align run (teacher, two rounds, final alignment) with the long line in its bitext:
    training skips it, the final alignment writes it an empty line."""
    from synthetic import monotone_corpus
    from test_run import TINY

    sources, targets, _ = monotone_corpus(40, seed=2)
    sources[LONG] = sources[0] * (WORDS // len(sources[0]) + 1)
    targets[LONG] = targets[0] * (WORDS // len(targets[0]) + 1)
    src, tgt, _ = write_corpus(tmp_path, "run", sources, targets)
    out = tmp_path / "out"
    run("run", "-s", src, "-t", tgt, "-o", out, *TINY)
    _check_lines(out.read_text(), len(sources), every_other=False)   # 3 updates: some
