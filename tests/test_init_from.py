"""`align train --init-from DIR`: fine-tuning starts every direction from DIR's best weights,
with DIR's BPE, vocabularies and model size; one-line errors for what cannot be started from."""
from __future__ import annotations

import json

import pytest
import torch

from aligner import constants as C
from cli_runner import error_line, run
from synthetic import monotone_corpus, write_corpus

#: one training run each (--rounds 1; self-training rounds: tests/test_self_training.py)
TINY = ["--model", "hmm1", "--bpe-merges", "20", "--d-model", "16", "--heads", "2",
        "--encoder-layers", "1", "--decoder-layers", "1", "--ff-dim", "32",
        "--max-tokens", "200", "--warmup", "2", "--lr", "3e-3", "--threads", "1", "-q",
        "--rounds", "1"]


def weights(model_dir, direction="fwd"):
    return torch.load(model_dir / direction / C.PARAMS_BEST, weights_only=True)["state_dict"]


def max_difference(a, b) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.fixture
def corpus(tmp_path):
    sources, targets, golds = monotone_corpus(40, seed=4)
    src, tgt, _ = write_corpus(tmp_path, "train", sources, targets, golds)
    # other text: new data to fine-tune on (its own BPE and vocabularies would differ)
    other_sources, other_targets, other_golds = monotone_corpus(30, seed=9)
    other_src, other_tgt, _ = write_corpus(tmp_path, "other", other_sources, other_targets,
                                           other_golds)
    return dict(src=src, tgt=tgt, other_src=other_src, other_tgt=other_tgt)


@pytest.fixture
def trained(tmp_path, corpus):
    model = tmp_path / "base_model"
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model, "--max-updates", 6,
        *TINY)
    return model


def test_fine_tuning_starts_from_the_weights(tmp_path, corpus, trained):
    # a learning rate of 1e-9: one update moves no weight by more than ~1e-8, so the
    # fine-tuned model must still hold the weights it started from
    tuned = tmp_path / "tuned"
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", tuned, "--max-updates", 1,
        "--init-from", trained, *TINY, "--lr", "1e-9")
    fresh = tmp_path / "fresh"
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", fresh, "--max-updates", 1,
        *TINY, "--lr", "1e-9")
    for direction in C.DIRECTIONS:
        assert max_difference(weights(tuned, direction), weights(trained, direction)) < 1e-6
        assert max_difference(weights(fresh, direction), weights(trained, direction)) > 1e-3
    extra = json.loads((tuned / C.CONFIG_NAME).read_text())["extra"]
    assert extra["init_from"] == str(trained.resolve())


def test_fine_tuning_continues_where_training_stopped(tmp_path, corpus, trained):
    """The first updates of a fine-tuned run have the trained model's loss, not a fresh one's."""
    def first_loss(model_dir):
        lines = (model_dir / "fwd" / C.METRICS_NAME).read_text().splitlines()
        header = lines[0].split("\t")
        return float(dict(zip(header, lines[1].split("\t")))["train_loss"])

    tuned, fresh = tmp_path / "tuned", tmp_path / "fresh"
    common = ["--max-updates", 1, "--checkpoint-interval", 1, *TINY]
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", tuned, "--init-from",
        trained, *common)
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", fresh, *common)
    trained_losses = [float(line.split("\t")[2]) for line in
                      (trained / "fwd" / C.METRICS_NAME).read_text().splitlines()[1:]]
    assert first_loss(tuned) < first_loss(fresh) - 0.2
    assert first_loss(tuned) < trained_losses[0]


def test_new_data_is_encoded_with_the_init_models_bpe_and_vocabularies(tmp_path, corpus,
                                                                      trained):
    tuned = tmp_path / "tuned"
    # other model-size and BPE flags are not used: the model is the one trained
    run("train", "-s", corpus["other_src"], "-t", corpus["other_tgt"], "-o", tuned,
        "--max-updates", 2, "--init-from", trained, *TINY, "--d-model", "32",
        "--bpe-merges", "5")
    for name in (C.VOCAB_SRC, C.VOCAB_TGT, C.BPE_CODES_SRC, C.BPE_CODES_TGT):
        assert (tuned / name).read_bytes() == (trained / name).read_bytes(), name
    tuned_config = json.loads((tuned / C.CONFIG_NAME).read_text())
    trained_config = json.loads((trained / C.CONFIG_NAME).read_text())
    assert tuned_config["models"] == trained_config["models"]
    assert tuned_config["models"]["fwd"]["d_model"] == 16
    # and it is trained on the new text: the corpus holds the new pairs
    assert json.loads((tuned / "corpus" / "corpus.json").read_text())["n_input"] == 30
    run("extract", tuned, "-s", corpus["other_src"], "-t", corpus["other_tgt"], "-o",
        tmp_path / "out.align", "-q")
    assert len((tmp_path / "out.align").read_text().splitlines()) == 30


def test_resume_of_a_fine_tuning_run(tmp_path, corpus, trained):
    tuned = tmp_path / "tuned"
    args = ["train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", tuned, "--init-from",
            trained, *TINY]
    run(*args, "--max-updates", 2)
    run(*args, "--max-updates", 4, "--resume")
    lines = (tuned / "fwd" / C.METRICS_NAME).read_text().splitlines()
    assert lines[-1].split("\t")[0] == "4"


def test_fine_tuning_with_agreement(tmp_path, corpus, trained):
    tuned = tmp_path / "tuned"
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", tuned, "--max-updates", 1,
        "--init-from", trained, "--agreement-weight", "1", *TINY, "--lr", "1e-9")
    for direction in C.DIRECTIONS:
        assert max_difference(weights(tuned, direction), weights(trained, direction)) < 1e-6


def test_init_from_errors(tmp_path, corpus, trained):
    base = ["train", "-s", corpus["src"], "-t", corpus["tgt"], "--max-updates", 1, *TINY]
    line = error_line(run(*base, "-o", tmp_path / "a", "--init-from", tmp_path / "missing",
                          ok=False))
    assert "missing: not a model directory (config.json is missing)" in line
    line = error_line(run(*base, "-o", tmp_path / "b", "--init-from", trained, "--model",
                          "hmm0", ok=False))
    assert "holds a 'hmm1' model, this run trains 'hmm0'" in line
    line = error_line(run(*base, "-o", trained, "--overwrite", "--init-from", trained,
                          ok=False))
    assert "the model directory being trained" in line
    assert (trained / "fwd" / C.PARAMS_BEST).exists()   # refused before anything was removed
    forward_only = tmp_path / "forward_only"
    run(*base, "-o", forward_only, "--directions", "fwd")
    line = error_line(run(*base, "-o", tmp_path / "c", "--init-from", forward_only, ok=False))
    assert "no trained rev model to start from" in line
