"""The best measured recipe: what `align run` trains and extracts when given no model flags.

One place for it, so that changing the recipe is one deliberate commit (tests/test_run.py pins
these values). Source of each number: eval/results/enfr_hmm1.md (hmm1 on en-fr 25k Hansards,
hmm-posterior with -H soft-average: 8.0 % AER on WPT03 dev, 7.8 % on trial after 1,800
updates per direction ≈ 2 epochs; eflomal on the same text: 7.1 / 7.5).
"""
from __future__ import annotations

from typing import Any, Dict

MODEL_KIND = "hmm1"
#: d_model 128, 3+3 layers, a 64-dim lexicon with a 1,000-word sampled softmax in training
MODEL_OPTIONS: Dict[str, Any] = dict(d_model=128, n_heads=4, enc_layers=3, dec_layers=3,
                                     d_ff=512, dropout=0.1, max_positions=1024,
                                     tie_embeddings=True, markov_order=0, lexicon_dim=64,
                                     lexicon_sample=1000)
#: small batches and a high learning rate: the most progress per CPU second
TRAINING: Dict[str, Any] = dict(lr=3e-3, warmup=150, max_tokens=1200, label_smoothing=0.1,
                                clip_norm=1.0)
#: weight of the agreement term between the directions (aligner/agreement.py; 0 = the
#: directions train apart, in parallel on a CPU)
AGREEMENT_WEIGHT = 0.0
#: passes over the corpus per direction (the recipe's 1,800 updates are 2.1 epochs of 25k pairs)
EPOCHS = 2
METHOD = "hmm-posterior"
HEURISTIC = "soft-average"
THRESHOLD = 0.5


def bpe_merges(n_pairs: int) -> int:
    """Joint BPE merges for a corpus of `n_pairs`: 5,000 at 25k pairs (the recipe), one per five
    pairs, rounded to thousands, between 1,000 and 10,000 (Zenkel et al.'s 10k for large data)."""
    return int(min(10000, max(1000, round(n_pairs / 5, -3))))
