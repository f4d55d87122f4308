"""The training loop: loss falls, resume is bit-identical, accumulation, freezing, schedule,
stopping rules, checkpoints and the model directory."""
from __future__ import annotations

import math
import os

import pytest
import torch

from aligner import constants as C
from aligner.config import DataConfig, RunConfig, TrainConfig
from aligner.data import EncodedCorpus, encode_corpus, encode_pair
from aligner.formats import GoldAlignment
from aligner.model_dir import (RUN_MARK, load_model, load_params, mark_run, prepare_output_dir,
                               save_params)
from aligner.models.transformer import Transformer, TransformerConfig
from aligner.prep import PrepConfig, Preprocessor
from aligner.training.loop import Trainer, Validation, learning_rate, seed_everything
from aligner.utils import AlignerError
from aligner.vocab import Vocabulary
from quality import Bar
from synthetic import monotone_corpus

CPU = torch.device("cpu")


def make_data(tmp_path, n_pairs=40, seed=0):
    """Encoded synthetic corpus + the preprocessor and vocabularies (whole words, no BPE)."""
    sources, targets, golds = monotone_corpus(n_pairs, seed=seed)
    pre = Preprocessor(PrepConfig(bpe_merges=0))
    src_vocab, tgt_vocab = Vocabulary.build(sources), Vocabulary.build(targets)
    encode_corpus(pre, src_vocab, tgt_vocab, sources, targets, str(tmp_path / "corpus"))
    corpus = EncodedCorpus.open(str(tmp_path / "corpus"))
    return corpus, pre, src_vocab, tgt_vocab, (sources, targets, golds)


def make_model(corpus_vocabs, dropout=0.1, seed=1, direction="fwd"):
    src_vocab, tgt_vocab = corpus_vocabs
    if direction == "rev":
        src_vocab, tgt_vocab = tgt_vocab, src_vocab
    seed_everything(seed)
    return Transformer(TransformerConfig(len(src_vocab), len(tgt_vocab), d_model=16, n_heads=2,
                                         enc_layers=1, dec_layers=2, d_ff=32, dropout=dropout,
                                         max_positions=32))


def config(**overrides) -> TrainConfig:
    values = dict(max_tokens=60, lr=3e-3, warmup=5, max_updates=8, max_epochs=0,
                  checkpoint_interval=4, log_interval=2, seed=3, device="cpu")
    values.update(overrides)
    return TrainConfig(**values)


def test_learning_rate_schedule_by_hand():
    cfg = config(lr=1.0, warmup=4)
    assert [learning_rate(cfg, u) for u in (1, 2, 4)] == [0.25, 0.5, 1.0]
    assert learning_rate(cfg, 16) == pytest.approx(0.5)       # sqrt(4/16)
    assert learning_rate(config(lr=0.1, warmup=0), 7) == 0.1   # no warm-up: constant


def test_linear_learning_rate_schedule_by_hand():
    # warm-up over 4 updates, then (T - u + 1) / (T - w + 1) of lr with T = 10, w = 4
    cfg = config(lr=1.0, warmup=4, lr_schedule="linear")
    rates = [learning_rate(cfg, u, 10) for u in range(1, 11)]
    assert rates == pytest.approx([0.25, 0.5, 0.75, 1.0, 6 / 7, 5 / 7, 4 / 7, 3 / 7, 2 / 7,
                                   1 / 7])
    # no warm-up: the full rate at update 1, 1/T of it at the last
    no_warmup = config(lr=1.0, warmup=0, lr_schedule="linear")
    assert [learning_rate(no_warmup, u, 4) for u in (1, 2, 4)] == pytest.approx([1, 0.75, 0.25])
    # a warm-up longer than the run: still warming up at its end
    assert learning_rate(config(lr=1.0, warmup=8, lr_schedule="linear"), 4, 4) == 0.5
    with pytest.raises(AlignerError, match="number of updates"):
        learning_rate(cfg, 3)
    with pytest.raises(AlignerError, match="--lr-schedule must be one of"):
        config(lr_schedule="cosine")


@pytest.mark.parametrize("limits, total", [
    (dict(max_updates=7, max_epochs=0), 7),
    (dict(max_updates=0, max_epochs=2), 10),   # 5 batches an epoch at max_tokens 50
    (dict(max_updates=3, max_epochs=2), 3),
    # 2 batches an update: the 10 batches of 2 epochs in 5 updates (the third takes one
    # batch of each epoch), not 2 x ceil(5 / 2) = 6
    (dict(max_updates=0, max_epochs=2, update_freq=2), 5)])
def test_linear_schedule_ends_at_the_runs_last_update(tmp_path, limits, total):
    """The Trainer's schedule spans the run it will do: max_updates, or max_epochs of batches."""
    corpus, _, src_vocab, tgt_vocab, _ = make_data(tmp_path)
    model = make_model((src_vocab, tgt_vocab), dropout=0.0)
    trainer = Trainer(model, corpus, "fwd", config(lr=1.0, warmup=2, lr_schedule="linear",
                                                   max_tokens=50, checkpoint_interval=1,
                                                   **limits),
                      None, CPU, progress=False)
    assert len(trainer.batcher) == 5
    summary = trainer.run()
    assert summary.updates == total == trainer.total_updates
    rates = [row["lr"] for row in summary.metrics]
    assert rates[0] == 0.5 and rates[-1] == pytest.approx(1 / (total - 1))
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1 / (total - 1))


def _train_tiny(tmp_path, seed: int):
    """60 updates of a tiny transformer on the synthetic corpus (`seed`: corpus, init and
    batches): (trainer summary, per-checkpoint train losses, target vocabulary size)."""
    corpus, _, src_vocab, tgt_vocab, _ = make_data(tmp_path, seed=seed)
    model = make_model((src_vocab, tgt_vocab), dropout=0.0, seed=seed + 1)
    trainer = Trainer(model, corpus, "fwd", config(max_updates=60, checkpoint_interval=10,
                                                   lr=1e-2, label_smoothing=0.0,
                                                   seed=seed + 3),
                      str(tmp_path / "fwd"), CPU, progress=False)
    summary = trainer.run()
    return summary, [row["train_loss"] for row in summary.metrics], len(tgt_vocab)


def _in_tmp(measure):
    """measure(tmp_path, seed) as a function of the seed alone (a fresh temporary directory)."""
    def measured(seed: int) -> float:
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as tmp:
            return measure(Path(tmp), seed)
    return measured


LOSS_FALLS = Bar("tiny transformer train loss at update 60 / at update 10",
                 _in_tmp(lambda tmp, seed: (lambda l: l[-1] / l[0])(_train_tiny(tmp, seed)[1])),
                 below=0.8, margin="measured 0.496-0.627")
LOSS_STEPS = Bar("tiny transformer: largest ratio of a checkpoint's loss to the one before",
                 _in_tmp(lambda tmp, seed: max(later / earlier for earlier, later in zip(
                     *(lambda l: (l, l[1:]))(_train_tiny(tmp, seed)[1])))),
                 below=1.0, margin="measured 0.915-0.960")
BARS = [LOSS_FALLS, LOSS_STEPS]


@pytest.mark.quality
def test_tiny_model_trains_and_loss_falls(tmp_path):
    summary, losses, tgt_vocab_size = _train_tiny(tmp_path, 0)
    assert summary.updates == 60 and len(losses) == 6
    assert LOSS_FALLS.passes(losses[-1] / losses[0]), (losses, LOSS_FALLS.margin)
    # falls at every checkpoint
    assert LOSS_STEPS.passes(max(b / a for a, b in zip(losses, losses[1:]))), losses
    assert losses[0] < math.log(tgt_vocab_size) + 0.5   # starts near uniform, not above
    lines = (tmp_path / "fwd" / C.METRICS_NAME).read_text().splitlines()
    assert lines[0].split("\t")[:3] == ["update", "epoch", "train_loss"]
    assert [line.split("\t")[0] for line in lines[1:]] == ["10", "20", "30", "40", "50", "60"]
    for name in (C.PARAMS_BEST, C.PARAMS_LAST, C.TRAINING_STATE):
        assert (tmp_path / "fwd" / name).is_file()


@pytest.mark.parametrize("update_freq", [1, 2])
def test_resume_is_bit_identical(tmp_path, update_freq):
    """N updates in one go == N/2 updates, a new process-like restart, N/2 more."""
    corpus, _, src_vocab, tgt_vocab, _ = make_data(tmp_path)
    vocabs = (src_vocab, tgt_vocab)
    cfg = config(max_updates=10, update_freq=update_freq, checkpoint_interval=3)
    whole = Trainer(make_model(vocabs), corpus, "fwd", cfg, str(tmp_path / "whole"), CPU,
                    progress=False)
    whole.run()

    half = Trainer(make_model(vocabs), corpus, "fwd", config(max_updates=5,
                                                             update_freq=update_freq,
                                                             checkpoint_interval=3),
                   str(tmp_path / "split"), CPU, progress=False)
    half.run()
    torch.manual_seed(12345)  # disturb every global RNG: resume must restore them
    torch.rand(7)
    rest = Trainer(make_model(vocabs, seed=99), corpus, "fwd", cfg, str(tmp_path / "split"),
                   CPU, progress=False)
    summary = rest.run(resume=True)
    assert summary.updates == 10
    assert whole.batcher.state_dict() == rest.batcher.state_dict()
    state_whole, state_rest = whole.model.state_dict(), rest.model.state_dict()
    assert all(torch.equal(state_whole[k], state_rest[k]) for k in state_whole)
    saved = torch.load(tmp_path / "split" / C.PARAMS_LAST, weights_only=True)["state_dict"]
    assert all(torch.equal(saved[k], state_whole[k]) for k in state_whole)
    # the metrics file of the resumed run continues the first one's rows
    rows = (tmp_path / "split" / C.METRICS_NAME).read_text().splitlines()[1:]
    assert [row.split("\t")[0] for row in rows] == ["3", "5", "6", "9", "10"]


def test_resume_of_a_finished_run_does_nothing(tmp_path):
    corpus, _, src_vocab, tgt_vocab, _ = make_data(tmp_path)
    first = Trainer(make_model((src_vocab, tgt_vocab)), corpus, "fwd", config(max_updates=3),
                    str(tmp_path / "d"), CPU, progress=False)
    first.run()
    again = Trainer(make_model((src_vocab, tgt_vocab)), corpus, "fwd", config(max_updates=3),
                    str(tmp_path / "d"), CPU, progress=False)
    summary = again.run(resume=True)
    assert summary.updates == 3 and len(summary.metrics) == 1


def test_accumulation_equals_one_big_batch(tmp_path):
    """update_freq 2 over batches A, B == one update on A ∪ B (loss normalized per update)."""
    corpus, _, src_vocab, tgt_vocab, _ = make_data(tmp_path)
    a, b = [0, 1, 2], [3, 4, 5, 6]
    results = []
    for batches in ([a, b], [a + b]):
        trainer = Trainer(make_model((src_vocab, tgt_vocab), dropout=0.0), corpus, "fwd",
                          config(clip_norm=0.0), None, CPU, progress=False)
        trainer._update(batches)  # gradients stay in .grad until the next update
        results.append({name: p.grad.clone() for name, p in trainer.model.named_parameters()})
    assert all(torch.allclose(results[0][k], results[1][k], rtol=1e-4, atol=1e-7)
               for k in results[0])


def test_only_trainable_parameters_change(tmp_path):
    corpus, _, src_vocab, tgt_vocab, _ = make_data(tmp_path)
    model = make_model((src_vocab, tgt_vocab))
    for parameter in model.encoder.parameters():
        parameter.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    Trainer(model, corpus, "fwd", config(max_updates=3), None, CPU, progress=False).run()
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if k.startswith("encoder."))
    assert not torch.equal(before["decoder.layers.0.ff.fc1.weight"],
                           after["decoder.layers.0.ff.fc1.weight"])


def test_a_guided_run_of_a_kind_without_a_posterior_is_one_error_line(tmp_path):
    """The trainer adds the guide term to the contract's training_terms: a kind that does not
    declare them (TRAINS_POSTERIOR False, here the transformer) is refused before training."""
    corpus, _, src_vocab, tgt_vocab, _ = make_data(tmp_path, n_pairs=8)
    with pytest.raises(AlignerError) as error:
        Trainer(make_model((src_vocab, tgt_vocab)), corpus, "fwd", config(guide_weight=1.0),
                None, CPU, progress=False)
    assert str(error.value) == ("guided alignment training needs the model's alignment "
                                "posterior: Transformer does not provide it (TRAINS_POSTERIOR "
                                "is False)")


def test_max_epochs_stops_after_whole_epochs(tmp_path):
    corpus, _, src_vocab, tgt_vocab, _ = make_data(tmp_path)
    trainer = Trainer(make_model((src_vocab, tgt_vocab)), corpus, "fwd",
                      config(max_updates=0, max_epochs=2, update_freq=2), None, CPU,
                      progress=False)
    per_epoch = len(trainer.batcher)
    summary = trainer.run()
    assert summary.epochs == 2
    # batches are handed out in order; an update may span the epoch boundary
    assert summary.updates == math.ceil(2 * per_epoch / 2)
    tokens = sum(int(corpus.tgt_lengths[i]) + 1 for epoch in (0, 1)
                 for batch in trainer.batcher.epoch_batches(epoch) for i in batch)
    assert summary.tokens == tokens


def test_rev_direction_trains_on_swapped_sides(tmp_path):
    corpus, _, src_vocab, tgt_vocab, _ = make_data(tmp_path)
    model = make_model((src_vocab, tgt_vocab), direction="rev")
    trainer = Trainer(model, corpus, "rev", config(max_updates=2), None, CPU, progress=False)
    summary = trainer.run()
    expected = sum(int(corpus.src_lengths[i]) + 1 for batch in
                   trainer.batcher.epoch_batches(0)[:2] for i in batch)
    assert summary.tokens == expected  # decoder tokens = source language + EOS


def test_validation_perplexity_and_aer_pick_the_best(tmp_path):
    corpus, pre, src_vocab, tgt_vocab, (sources, targets, golds) = make_data(tmp_path)
    pairs = [encode_pair(pre, src_vocab, tgt_vocab, s, t) for s, t in zip(sources, targets)]
    validation = Validation(pairs[:8], [GoldAlignment(sure=g) for g in golds[:8]])
    model = make_model((src_vocab, tgt_vocab), dropout=0.0)
    ppl = validation.perplexity(model, "fwd", CPU)
    # perplexity by hand: exp(total NLL / tokens) over the 8 pairs, one at a time
    total, tokens = 0.0, 0
    from aligner.data import make_batch
    with torch.no_grad():
        for pair in pairs[:8]:
            batch = make_batch([pair.src_ids], [pair.tgt_ids], "fwd")
            loss, n = model.loss(batch.src, batch.tgt_in, batch.tgt_out)
            total, tokens = total + float(loss), tokens + int(n)
    assert ppl == pytest.approx(math.exp(total / tokens), rel=1e-4)
    assert 0.0 <= validation.aer(model, "fwd", CPU) <= 1.0
    trainer = Trainer(model, corpus, "fwd", config(max_updates=6, checkpoint_interval=2),
                      str(tmp_path / "fwd"), CPU, validation=validation, progress=False)
    summary = trainer.run()
    aers = [row["valid_aer"] for row in summary.metrics]
    assert summary.best_score == min(aers)
    assert summary.best_update == summary.metrics[aers.index(min(aers))]["update"]
    best = make_model((src_vocab, tgt_vocab), dropout=0.0)
    load_params(best, str(tmp_path / "fwd" / C.PARAMS_BEST))
    assert validation.aer(best, "fwd", CPU) == pytest.approx(min(aers))


def test_save_and_load_params_round_trip_and_errors(tmp_path):
    corpus, _, src_vocab, tgt_vocab, _ = make_data(tmp_path)
    model = make_model((src_vocab, tgt_vocab))
    path = str(tmp_path / "p.pt")
    save_params(model, path)
    other = make_model((src_vocab, tgt_vocab), seed=5)
    load_params(other, path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 other.state_dict().values()))
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(AlignerError, match="bad.pt: cannot be read as a weights file"):
        load_params(other, str(tmp_path / "bad.pt"))
    with pytest.raises(AlignerError, match="missing.pt: missing"):
        load_params(other, str(tmp_path / "missing.pt"))
    bigger = Transformer(TransformerConfig(len(src_vocab) + 1, len(tgt_vocab), d_model=16,
                                           n_heads=2, enc_layers=1, dec_layers=2, d_ff=32))
    with pytest.raises(AlignerError, match="do not fit the model"):
        load_params(bigger, path)


def test_weights_files_never_unpickle_code(tmp_path):
    """A weights file holding a pickled object is refused (torch.load weights_only=True)."""

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "evil.pt"
    torch.save({"state_dict": {}, "extra_state": Evil()}, path)
    model = Transformer(TransformerConfig(8, 8, d_model=8, n_heads=2, enc_layers=1,
                                          dec_layers=1, d_ff=8))
    with pytest.raises(AlignerError, match="cannot be read as a weights file"):
        load_params(model, str(path))


def test_prepare_output_dir_rules(tmp_path):
    target = tmp_path / "model"
    assert prepare_output_dir(str(target), resume=False, overwrite=False) is False
    (target / C.CONFIG_NAME).write_text("{}")
    (target / "fwd").mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(AlignerError, match="not empty; use --resume .* or --overwrite"):
        prepare_output_dir(str(target), resume=False, overwrite=False)
    assert prepare_output_dir(str(target), resume=True, overwrite=False) is True
    # a config.json that is not ours, no version file: not a run of ours, nothing removed
    with pytest.raises(AlignerError, match="holds no run .* nothing was removed"):
        prepare_output_dir(str(target), resume=False, overwrite=True)
    assert sorted(os.listdir(target)) == [C.CONFIG_NAME, "fwd", "notes.txt"]
    (target / C.VERSION_NAME).write_text("1.4.2\n")   # another project's version file: not ours
    with pytest.raises(AlignerError, match="holds no run .* nothing was removed"):
        prepare_output_dir(str(target), resume=False, overwrite=True)
    mark_run(str(target))                              # the mark every run writes first
    assert prepare_output_dir(str(target), resume=False, overwrite=True) is False
    # the run's own files removed; the mark stays
    assert sorted(os.listdir(target)) == [RUN_MARK, "notes.txt"]
    with pytest.raises(AlignerError, match="cannot resume"):
        prepare_output_dir(str(target), resume=True, overwrite=False)
    with pytest.raises(AlignerError, match="nothing to resume"):
        prepare_output_dir(str(tmp_path / "new"), resume=True, overwrite=False)


def test_run_config_round_trip_and_differences(tmp_path):
    config = RunConfig(model_kind="transformer", directions=["fwd", "rev"],
                       models={"fwd": {"d_model": 8}, "rev": {"d_model": 8}},
                       prep=PrepConfig().to_dict(), data=DataConfig(),
                       training=TrainConfig(max_updates=5))
    path = str(tmp_path / C.CONFIG_NAME)
    config.save(path)
    loaded = RunConfig.load(path)
    assert loaded.to_dict() == config.to_dict()
    more = RunConfig.from_dict({**config.to_dict(),
                                "training": {**config.training.to_dict(), "max_updates": 9,
                                             "lr": 0.1}})
    assert config.differences(more) == ["training.lr"]  # max_updates may change on resume
    with pytest.raises(AlignerError, match="format version 99"):
        RunConfig.from_dict({**config.to_dict(), "format_version": 99})
    with pytest.raises(AlignerError, match="unknown keys lr2"):
        TrainConfig.from_dict({"lr2": 1})
    with pytest.raises(AlignerError, match="--max-updates or --max-epochs"):
        TrainConfig(max_updates=0, max_epochs=0)


def test_load_model_from_directory(tmp_path):
    corpus, _, src_vocab, tgt_vocab, _ = make_data(tmp_path)
    model = make_model((src_vocab, tgt_vocab))
    config = RunConfig(model_kind="transformer", directions=["fwd"],
                       models={"fwd": model.config.to_dict()}, prep=PrepConfig().to_dict())
    config.save(str(tmp_path / C.CONFIG_NAME))
    (tmp_path / "fwd").mkdir()
    save_params(model, str(tmp_path / "fwd" / C.PARAMS_BEST))
    loaded = load_model(str(tmp_path), "fwd")
    assert not loaded.training
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 loaded.state_dict().values()))
    with pytest.raises(AlignerError, match="params.last.pt: missing"):
        load_model(str(tmp_path), "fwd", checkpoint="last")
    with pytest.raises(AlignerError, match="no 'rev' model"):
        load_model(str(tmp_path), "rev")


def test_without_gold_the_best_checkpoint_has_the_lowest_perplexity(tmp_path):
    corpus, pre, src_vocab, tgt_vocab, (sources, targets, _) = make_data(tmp_path)
    pairs = [encode_pair(pre, src_vocab, tgt_vocab, s, t) for s, t in zip(sources, targets)]
    trainer = Trainer(make_model((src_vocab, tgt_vocab)), corpus, "fwd",
                      config(max_updates=6, checkpoint_interval=2), str(tmp_path / "fwd"), CPU,
                      validation=Validation(pairs[:6]), progress=False)
    summary = trainer.run()
    ppls = [row["valid_ppl"] for row in summary.metrics]
    assert all(row["valid_aer"] is None for row in summary.metrics)
    assert summary.best_score == min(ppls) and len(ppls) == 3
    rows = (tmp_path / "fwd" / C.METRICS_NAME).read_text().splitlines()[1:]
    assert all(row.split("\t")[5] == "-" for row in rows)  # no AER column value
