"""Settings for GPU runs, tested on the CPU: --deterministic (aligner.train.
use_deterministic_algorithms) is accepted, recorded, and changes no CPU output."""
from __future__ import annotations

import hashlib
import json
import os

import pytest
import torch

from aligner import constants as C
from conftest import restored_aligner_logger
from cli_runner import run
from synthetic import monotone_corpus, write_corpus

TINY_HMM = ["--model", "hmm1", "--bpe-merges", "20", "--d-model", "16", "--heads", "2",
            "--encoder-layers", "1", "--decoder-layers", "1", "--ff-dim", "32",
            "--max-tokens", "200", "--warmup", "2", "--rounds", "1", "--serial-directions",
            "--threads", "1", "-q"]
TINY_RUN = ["--max-updates", "3", "-M", "d_model=16", "-M", "n_heads=2", "-M", "enc_layers=1",
            "-M", "dec_layers=1", "-M", "d_ff=32", "-M", "max_positions=32", "--rounds", "1",
            "--bpe-merges", "0", "--threads", "1", "-q"]


@pytest.fixture
def deterministic_reset():
    """--deterministic switches torch's global flag on for the process (the command's, in a
    real run): switched off again after the test, the environment restored."""
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    yield
    torch.use_deterministic_algorithms(False)
    if workspace is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace


@pytest.fixture
def corpus(tmp_path):
    sources, targets, _ = monotone_corpus(40, seed=4)
    src, tgt, _ = write_corpus(tmp_path, "train", sources, targets)
    return src, tgt


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_deterministic_train_is_recorded_and_changes_no_cpu_byte(tmp_path, corpus,
                                                                 deterministic_reset):
    src, tgt = corpus
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", tmp_path / "plain", "--max-updates", 3,
            *TINY_HMM)
        assert not torch.are_deterministic_algorithms_enabled()
        run("train", "-s", src, "-t", tgt, "-o", tmp_path / "det", "--max-updates", 3,
            "--deterministic", *TINY_HMM)
    assert torch.are_deterministic_algorithms_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    for name, flag in (("plain", False), ("det", True)):
        config = json.load(open(tmp_path / name / C.CONFIG_NAME))
        assert config["training"]["deterministic"] is flag
        record = json.load(open(tmp_path / name / C.RUN_RECORD_NAME))
        assert record["sessions"][0]["deterministic"] is flag
    for direction in C.DIRECTIONS:
        for params in (C.PARAMS_LAST, C.PARAMS_BEST):
            assert _digest(tmp_path / "plain" / direction / params) == \
                _digest(tmp_path / "det" / direction / params)
    for name in ("plain", "det"):
        run("extract", tmp_path / name, "-s", src, "-t", tgt, "-o", tmp_path / f"{name}.align",
            "-q")
    assert _digest(tmp_path / "plain.align") == _digest(tmp_path / "det.align")
    # a resume may switch it (like --device): the same weights either way on the CPU
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", tmp_path / "plain", "--max-updates", 4,
            "--resume", "--deterministic", *TINY_HMM)


def test_deterministic_run_gives_the_same_alignments_on_the_cpu(tmp_path, corpus,
                                                                deterministic_reset):
    src, tgt = corpus
    outputs = []
    for flags in ([], ["--deterministic"]):
        out = tmp_path / f"out{len(flags)}.txt"
        with restored_aligner_logger():
            run("run", "-s", src, "-t", tgt, "-o", out, "--model-dir", tmp_path / f"m{len(flags)}",
                *flags, *TINY_RUN)
        outputs.append(out.read_bytes())
        config = json.load(open(tmp_path / f"m{len(flags)}" / C.CONFIG_NAME))
        assert config["training"]["deterministic"] is bool(flags)
    assert outputs[0] == outputs[1] and outputs[0].strip()
