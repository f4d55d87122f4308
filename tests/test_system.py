"""System test (slow): a small transformer learns a synthetic dictionary corpus whose gold
alignment is known, and its attention alignments beat a stated AER.

The corpus: source word s<k> always translates to t<k>, target = word-by-word translation with
some adjacent words swapped (10% of positions), so the gold alignment is the diagonal with a
few crossings. Attention must follow the swaps to score well.
"""
from __future__ import annotations

import functools
import os
import tempfile

import pytest

from aligner import constants as C
from aligner.config import DataConfig, TrainConfig
from aligner.extract.inference import extract_all
from aligner.formats import Bitext, GoldAlignment
from aligner.links.metrics import score_aer
from aligner.model_dir import LoadedModelDir
from aligner.prep import PrepConfig
from aligner.training.run import train_model_dir
from quality import Bar
from synthetic import monotone_corpus

def _synthetic_aers(seed: int):
    """{method: {fwd, rev, grow-diag: AER}} of a small transformer trained on the synthetic
    corpus (`seed`: the corpus and the training run), on 100 held-in test pairs."""
    sources, targets, golds = monotone_corpus(1500, vocab=40, min_len=3, max_len=9,
                                              seed=11 + seed, swap_rate=0.1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        train_model_dir(model_dir, Bitext(sources, targets, "s", "t"), "transformer",
                        dict(d_model=64, n_heads=4, enc_layers=2, dec_layers=2, d_ff=128,
                             dropout=0.0, max_positions=64),
                        PrepConfig(bpe_merges=0), DataConfig(),
                        TrainConfig(max_tokens=1000, lr=2e-3, warmup=50, label_smoothing=0.0,
                                    max_updates=300, max_epochs=0, checkpoint_interval=300,
                                    device="cpu", seed=1 + seed), quiet=True)
        loaded = LoadedModelDir.load(model_dir)
        test = Bitext(sources[:100], targets[:100], "s", "t")
        gold = [GoldAlignment(sure=g) for g in golds[:100]]
        scores = {}
        for method in ("attention", "attention-avg"):
            result = extract_all(loaded, test, method)
            scores[method] = {key: score_aer(result[key], gold).aer
                              for key in ("fwd", "rev", C.DEFAULT_HEURISTIC)}
    return scores


_cached_aers = functools.lru_cache(maxsize=None)(_synthetic_aers)

#: the grow-diag AER each attention method must beat on the held-in test pairs
ATTENTION = {method: Bar(f"grow-diag AER of {method} on the synthetic corpus",
                         lambda seed, method=method: _cached_aers(seed)[method][
                             C.DEFAULT_HEURISTIC],
                         below=limit, margin=f"measured {margin}")
             for method, limit, margin in (("attention", 0.25, "0.116-0.202"),
                                           ("attention-avg", 0.2, "0.080-0.134"))}
BARS = list(ATTENTION.values())


@pytest.mark.slow
@pytest.mark.quality
def test_attention_learns_a_synthetic_alignment():
    for bar in ATTENTION.values():
        bar.check(0)
