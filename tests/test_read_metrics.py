"""aligner.training.loop.read_metrics, the reader of metrics.tsv: what the trainer writes reads back
(same columns, "-" as None, numbers parsed), and a file that is not such a table is one error
line naming file and line."""
from __future__ import annotations

import math

import pytest
import torch

from aligner import constants as C
from aligner.config import TrainConfig
from aligner.data import EncodedCorpus, encode_corpus, encode_pair
from aligner.formats import GoldAlignment
from aligner.models.transformer import Transformer, TransformerConfig
from aligner.prep import PrepConfig, Preprocessor
from aligner.training.loop import (METRICS_COLUMNS, Trainer, Validation, _format_metric, read_metrics,
                           seed_everything)
from aligner.utils import AlignerError
from aligner.vocab import Vocabulary
from synthetic import monotone_corpus


def as_written(row):
    """A metrics row as the writer's 6 significant digits leave it."""
    return {key: (None if row.get(key) is None else int(row[key]) if key in ("update", "epoch")
                  else float(_format_metric(row[key]))) for key in METRICS_COLUMNS}


@pytest.mark.parametrize("with_validation", [False, True])
def test_what_the_trainer_writes_reads_back(tmp_path, with_validation):
    sources, targets, golds = monotone_corpus(30, seed=0)
    pre = Preprocessor(PrepConfig(bpe_merges=0))
    src_vocab, tgt_vocab = Vocabulary.build(sources), Vocabulary.build(targets)
    encode_corpus(pre, src_vocab, tgt_vocab, sources, targets, str(tmp_path / "corpus"))
    corpus = EncodedCorpus.open(str(tmp_path / "corpus"))
    validation = None
    if with_validation:
        pairs = [encode_pair(pre, src_vocab, tgt_vocab, s, t) for s, t in zip(sources, targets)]
        validation = Validation(pairs[:6], [GoldAlignment(sure=g) for g in golds[:6]])
    seed_everything(1)
    model = Transformer(TransformerConfig(len(src_vocab), len(tgt_vocab), d_model=16, n_heads=2,
                                          enc_layers=1, dec_layers=1, d_ff=32, max_positions=32))
    config = TrainConfig(max_tokens=60, lr=3e-3, warmup=2, max_updates=4, max_epochs=0,
                         checkpoint_interval=2, seed=3, device="cpu")
    summary = Trainer(model, corpus, "fwd", config, str(tmp_path / "fwd"), torch.device("cpu"),
                      validation=validation, progress=False).run()

    rows = read_metrics(str(tmp_path / "fwd" / C.METRICS_NAME))
    assert rows == [as_written(row) for row in summary.metrics]
    assert [row["update"] for row in rows] == [2, 4]
    assert all(list(row) == list(METRICS_COLUMNS) for row in rows)
    assert all(isinstance(row["elapsed_s"], float) for row in rows)
    assert all((row["valid_aer"] is None) != with_validation for row in rows)


def test_cells_by_the_writers_own_formatting(tmp_path):
    row = {"update": 100, "epoch": 2, "train_loss": 1.234567891, "train_ppl": float("nan"),
           "valid_ppl": None, "valid_aer": 0.25, "lr": 3e-4, "tokens_per_s": 512,
           "elapsed_s": float("inf")}
    path = tmp_path / C.METRICS_NAME
    path.write_text("\t".join(METRICS_COLUMNS) + "\n"
                    + "\t".join(_format_metric(row[k]) for k in METRICS_COLUMNS) + "\n")
    (read,) = read_metrics(str(path))
    assert read["update"] == 100 and isinstance(read["update"], int) and read["epoch"] == 2
    assert read["train_loss"] == 1.23457 and math.isnan(read["train_ppl"])
    assert read["valid_ppl"] is None and read["valid_aer"] == 0.25 and read["lr"] == 3e-4
    assert read["tokens_per_s"] == 512.0 and read["elapsed_s"] == float("inf")
    path.write_text("\t".join(METRICS_COLUMNS) + "\n")         # no checkpoint yet
    assert read_metrics(str(path)) == []


def test_a_file_that_is_not_a_metrics_table_is_one_error_line(tmp_path):
    path = tmp_path / C.METRICS_NAME
    header = "\t".join(METRICS_COLUMNS)
    cases = [("update\tloss\n1\t2\n", r":1: not a metrics\.tsv of `align train` \(columns "
                                       r"update, loss; expected update, epoch"),
             ("", r":1: not a metrics\.tsv .*columns none"),
             (header + "\n1\t0\t5\n", r":2: 3 cells, expected 9"),
             (header + "\n" + "\t".join(["1"] * 9) + "\n\n", r":3: 1 cells, expected 9"),
             (header + "\n1.5" + "\t1" * 8 + "\n", r":2: update is not a number \('1\.5'\)"),
             (header + "\n1" + "\t1" * 7 + "\tabc\n", r":2: elapsed_s is not a number")]
    for text, message in cases:
        path.write_text(text)
        with pytest.raises(AlignerError, match=message):
            read_metrics(str(path))
