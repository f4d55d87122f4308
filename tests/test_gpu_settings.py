"""Settings for GPU runs, tested on the CPU: --deterministic (aligner.training.loop.
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

#: without the settings that depend on the device
TINY_SIZES = ["--model", "hmm1", "--bpe-merges", "20", "--d-model", "16", "--heads", "2",
              "--encoder-layers", "1", "--decoder-layers", "1", "--ff-dim", "32", "--rounds",
              "1", "--serial-directions", "--threads", "1", "-q"]
TINY_HMM = TINY_SIZES + ["--max-tokens", "200", "--warmup", "2"]
TINY_RUN_SIZES = ["-M", "d_model=16", "-M", "n_heads=2", "-M", "enc_layers=1", "-M",
                  "dec_layers=1", "-M", "d_ff=32", "-M", "max_positions=32", "--rounds", "1",
                  "--bpe-merges", "0", "--threads", "1", "-q"]
TINY_RUN = ["--max-updates", "3"] + TINY_RUN_SIZES


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


# -- the device-dependent defaults (aligner/training/recipe.py device_defaults) -------------------

def test_cpu_defaults_are_the_measured_recipe():
    from aligner.training import recipe
    from aligner.models.direct_hmm import DirectHMMConfig

    for device in (torch.device("cpu"), "cpu"):
        assert recipe.device_defaults(device) == dict(
            max_tokens=1200, lr=3e-3, warmup=150, chunk_floats=1 << 24)
    assert recipe.CPU_CHUNK_FLOATS == DirectHMMConfig.chunk_floats


def test_cuda_defaults_are_a_pure_function_of_the_device_type():
    """No CUDA needed: torch.device objects (and names) of CUDA devices give the same values:
    the CPU's batches, rate and warm-up (recipe.py says what was measured on an H100) and
    the larger chunk budget."""
    from aligner.training import recipe

    expected = dict(max_tokens=1200, lr=3e-3, warmup=150, chunk_floats=1 << 28)
    for device in (torch.device("cuda"), torch.device("cuda", 1), "cuda", "cuda:3"):
        assert recipe.device_defaults(device) == expected


#: a device whose defaults differ from the CPU's in every setting: how the commands resolve
#: device defaults, shown on this CPU
OTHER_DEVICE = dict(max_tokens=2400, lr=5e-3, warmup=40, chunk_floats=1 << 28)


def _gpu_defaults(monkeypatch):
    """The commands on this CPU take :data:`OTHER_DEVICE`'s defaults (device_defaults gives
    them for any device here): how align train/run resolve them, without a GPU."""
    from aligner.training import recipe

    monkeypatch.setattr(recipe, "device_defaults", lambda device: dict(OTHER_DEVICE))


def _training(model_dir):
    config = json.load(open(model_dir / C.CONFIG_NAME))
    return config["training"], config["models"]


def test_train_takes_the_device_defaults_and_explicit_values_win(tmp_path, corpus, monkeypatch):
    src, tgt = corpus
    tiny = TINY_SIZES
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", tmp_path / "cpu", "--max-updates", 1, *tiny)
        _gpu_defaults(monkeypatch)
        run("train", "-s", src, "-t", tgt, "-o", tmp_path / "gpu", "--max-updates", 1, *tiny)
        run("train", "-s", src, "-t", tgt, "-o", tmp_path / "given", "--max-updates", 1,
            "--max-tokens", 300, "--lr", 1e-3, "-M", "chunk_floats=1000", *tiny)
    training, models = _training(tmp_path / "cpu")
    assert (training["max_tokens"], training["lr"], training["warmup"]) == (1200, 3e-3, 150)
    assert all("chunk_floats" not in m for m in models.values())   # config.json as before
    training, models = _training(tmp_path / "gpu")
    assert (training["max_tokens"], training["lr"], training["warmup"]) == (2400, 5e-3, 40)
    assert all(m["chunk_floats"] == 1 << 28 for m in models.values())
    training, models = _training(tmp_path / "given")
    # given --max-tokens: the recipe's warm-up, as before the device defaults
    assert (training["max_tokens"], training["lr"], training["warmup"]) == (300, 1e-3, 150)
    assert all(m["chunk_floats"] == 1000 for m in models.values())


def test_a_run_resumed_on_another_device_keeps_its_own_settings(tmp_path, corpus, monkeypatch):
    """Trained with the CPU's defaults, resumed where the defaults are the GPU's: the run's
    own max_tokens, lr, warm-up and chunk budget (the batcher and the settings check would
    refuse others)."""
    src, tgt = corpus
    tiny = TINY_SIZES
    model = tmp_path / "m"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", model, "--max-updates", 1, *tiny)
        _gpu_defaults(monkeypatch)
        run("train", "-s", src, "-t", tgt, "-o", model, "--max-updates", 2, "--resume", *tiny)
    training, models = _training(model)
    assert (training["max_tokens"], training["lr"], training["warmup"]) == (1200, 3e-3, 150)
    assert all("chunk_floats" not in m for m in models.values())


def test_a_self_training_run_cut_off_between_rounds_resumes_with_its_own_settings(
        tmp_path, corpus, monkeypatch):
    """align run cut off as round 2 begins (MODEL_DIR/config.json is written only after the
    last round), resumed where the defaults are another device's: round 2 trains with round
    1's batches, rate and warm-up."""
    from aligner import faults

    src, tgt = corpus
    args = ["-s", src, "-t", tgt, "-o", tmp_path / "out", "--model-dir", tmp_path / "m",
            *TINY_RUN_SIZES, "--max-updates", "1", "--rounds", "2"]
    with restored_aligner_logger():
        with faults.injected("round-start", 1):
            run("run", *args, ok=False)
        assert not (tmp_path / "m" / C.CONFIG_NAME).exists()
        _gpu_defaults(monkeypatch)
        run("run", *args, "--resume")
    for folder in (tmp_path / "m" / "rounds" / "2", tmp_path / "m"):
        training, models = _training(folder)
        assert (training["max_tokens"], training["lr"], training["warmup"]) == (1200, 3e-3, 150)
        assert all("chunk_floats" not in m for m in models.values())


def test_run_takes_the_device_defaults_and_explicit_values_win(tmp_path, corpus, monkeypatch):
    src, tgt = corpus
    tiny = TINY_RUN_SIZES + ["--max-updates", "1"]
    _gpu_defaults(monkeypatch)
    with restored_aligner_logger():
        run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o1", "--model-dir", tmp_path / "gpu",
            *tiny)
        run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o2", "--model-dir",
            tmp_path / "given", "--max-tokens", 300, "--lr", 1e-3, *tiny)
        run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o3", "--model-dir",
            tmp_path / "warmup", "--warmup", 7, *tiny)
    training, models = _training(tmp_path / "gpu")
    assert (training["max_tokens"], training["lr"], training["warmup"]) == (2400, 5e-3, 40)
    assert all(m["chunk_floats"] == 1 << 28 for m in models.values())
    training, _ = _training(tmp_path / "given")
    assert (training["max_tokens"], training["lr"], training["warmup"]) == (300, 1e-3, 150)
    training, _ = _training(tmp_path / "warmup")   # --warmup alone: the device's batches
    assert (training["max_tokens"], training["lr"], training["warmup"]) == (2400, 5e-3, 7)
