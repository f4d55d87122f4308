"""DDP on CPU: two gloo processes (as torchrun would start them) train one model.

Checks: both ranks end with identical parameters; with dropout 0 they equal a single process
that accumulates the same two batches per update (so gradients are normalized by the tokens
of all ranks); only rank 0 writes the model directory.
"""
from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from aligner import constants as C
from aligner.config import DataConfig, TrainConfig
from aligner.data import EncodedCorpus, encode_corpus
from aligner.distributed import init_distributed, shutdown_distributed
from aligner.formats import Bitext
from aligner.models.transformer import Transformer, TransformerConfig
from aligner.prep import PrepConfig, Preprocessor
from aligner.training.loop import Trainer, seed_everything
from aligner.training.run import train_model_dir
from aligner.vocab import Vocabulary
from synthetic import monotone_corpus

CPU = torch.device("cpu")
MODEL = dict(d_model=16, n_heads=2, enc_layers=1, dec_layers=1, d_ff=32, dropout=0.0,
             max_positions=32)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _environment(rank: int, world_size: int, port: int) -> None:
    """What torchrun sets for every worker."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)


def _config(**overrides) -> TrainConfig:
    values = dict(max_tokens=60, lr=3e-3, warmup=2, max_updates=4, max_epochs=0,
                  checkpoint_interval=2, seed=5, device="cpu")
    values.update(overrides)
    return TrainConfig(**values)


def _model(corpus_dir: str) -> Transformer:
    vocab_sizes = [int(x) for x in open(os.path.join(corpus_dir, "sizes")).read().split()]
    seed_everything(1)
    return Transformer(TransformerConfig(*vocab_sizes, **MODEL))


def _trainer_worker(rank: int, world_size: int, port: int, workdir: str) -> None:
    _environment(rank, world_size, port)
    context = init_distributed("cpu")
    assert (context.rank, context.world_size) == (rank, world_size)
    corpus = EncodedCorpus.open(os.path.join(workdir, "corpus"))
    model = _model(os.path.join(workdir, "corpus"))
    trainer = Trainer(model, corpus, "fwd", _config(), os.path.join(workdir, "ddp", "fwd"), CPU,
                      context, progress=False)
    trainer.run()
    torch.save(model.state_dict(), os.path.join(workdir, f"rank{rank}.pt"))
    shutdown_distributed(context)


def _pipeline_worker(rank: int, world_size: int, port: int, workdir: str) -> None:
    _environment(rank, world_size, port)
    sources, targets, _ = monotone_corpus(40, seed=7)
    train_model_dir(os.path.join(workdir, "model"), Bitext(sources, targets, "s", "t"),
                    "transformer", dict(MODEL), PrepConfig(bpe_merges=10), DataConfig(),
                    _config(), directions=("fwd",), quiet=True)


@pytest.fixture
def workdir(tmp_path):
    sources, targets, _ = monotone_corpus(40, seed=7)
    pre = Preprocessor(PrepConfig(bpe_merges=0))
    src_vocab, tgt_vocab = Vocabulary.build(sources), Vocabulary.build(targets)
    encode_corpus(pre, src_vocab, tgt_vocab, sources, targets, str(tmp_path / "corpus"))
    (tmp_path / "corpus" / "sizes").write_text(f"{len(src_vocab)} {len(tgt_vocab)}")
    return tmp_path


def test_two_gloo_ranks_agree_and_match_accumulation(workdir):
    mp.spawn(_trainer_worker, args=(2, _free_port(), str(workdir)), nprocs=2, join=True)
    rank0 = torch.load(workdir / "rank0.pt", weights_only=True)
    rank1 = torch.load(workdir / "rank1.pt", weights_only=True)
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    # only rank 0 wrote files; its saved weights are the final ones
    saved = torch.load(workdir / "ddp" / "fwd" / C.PARAMS_LAST, weights_only=True)["state_dict"]
    assert all(torch.equal(saved[k], rank0[k]) for k in rank0)
    state = torch.load(workdir / "ddp" / "fwd" / C.TRAINING_STATE, weights_only=True)
    assert state["batcher"]["world_size"] == 2
    # one process accumulating the same batches (rank r takes batch 2k + r) gives the same model
    corpus = EncodedCorpus.open(str(workdir / "corpus"))
    single = _model(str(workdir / "corpus"))
    Trainer(single, corpus, "fwd", _config(update_freq=2), None, CPU, progress=False).run()
    reference = single.state_dict()
    assert all(torch.allclose(reference[k], rank0[k], atol=1e-5) for k in rank0)


@pytest.mark.slow
def test_torchrun_style_pipeline_writes_model_dir_on_rank_zero_only(workdir):
    mp.spawn(_pipeline_worker, args=(2, _free_port(), str(workdir)), nprocs=2, join=True)
    model = workdir / "model"
    for name in (C.CONFIG_NAME, C.VOCAB_SRC, "fwd/params.best.pt", "fwd/metrics.tsv"):
        assert (model / name).exists(), name
    rows = (model / "fwd" / C.METRICS_NAME).read_text().splitlines()[1:]
    assert [row.split("\t")[0] for row in rows] == ["2", "4"]
    log = (model / C.LOG_NAME).read_text()
    assert "2 process(es)" in log
    assert not [name for name in os.listdir(model) if name.endswith(".tmp")]
