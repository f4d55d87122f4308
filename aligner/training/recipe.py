"""The recipe: what `align train` (then `align extract`) and `align run` train and extract when
given no model flags, as plain values, and `align demo`'s deviations from it.

One place for every default of the commands that train (their click options, the job builder
aligner/training/builder.py and TrainConfig read them here), so that changing the recipe is
one deliberate commit (tests/test_defaults.py and tests/test_run.py pin these values; the
commands' --help is made from them, tests/test_help_recipe.py). Each value names the results
file (eval/results/) that chose it; the measurements, and the values before them, are in
eval/results/HISTORY.md ("The recipe's measurements").
"""
from __future__ import annotations

from typing import Any, Dict

#: the model kind: the first-order direct HMM (enfr_hmm1.md)
MODEL_KIND = "hmm1"
#: its size: d_model 128, 3+3 layers, a 64-dim linear lexicon with its exact softmax
#: (linear_lexicon.md), no dropout (dropout_enfr.md)
MODEL_OPTIONS: Dict[str, Any] = dict(d_model=128, n_heads=4, enc_layers=3, dec_layers=3,
                                     d_ff=512, dropout=0.0, max_positions=1024,
                                     tie_embeddings=True, markov_order=0, lexicon_dim=64,
                                     lexicon_sample=0, lexicon_activation="linear")
#: self-training rounds that repeat their epochs this many times or more (round_epoch_repeats:
#: a bitext of under 5,000 lines) train a smaller network with dropout, SMALL_MODEL_OPTIONS over
#: MODEL_OPTIONS: the recipe's network learns so few lines by heart (learning_curve_enfr.md)
SMALL_MODEL_REPEATS = 6
SMALL_MODEL_OPTIONS: Dict[str, Any] = dict(d_model=64, enc_layers=2, dec_layers=2, d_ff=256,
                                           dropout=0.2)
#: batches, learning rate and schedule of round 1 (and of one plain training): small batches
#: and a high learning rate, the most progress per CPU second (enfr_hmm1.md)
TRAINING: Dict[str, Any] = dict(lr=3e-3, warmup=150, lr_schedule="inverse-sqrt",
                                max_tokens=1200, label_smoothing=0.1, clip_norm=1.0)
#: the bitext that the teacher, the rounds and their guides train on: its lines joined end to end
#: in runs of 1 to JOIN_LINES consecutive lines, at most JOIN_WORDS words a side; the output
#: aligns every line as given (aligner/training/joined_text.py). 1 (off): runs of 1-5 helped
#: ja-en dev (73.6 -> 64.5) but cost en-fr dev 0.25 (5.25 -> 5.5) and doubled its training
#: time (join_lines_jaen.md)
JOIN_LINES = 1
JOIN_WORDS = 64
#: weight of the agreement term between the directions (aligner/training/agreement.py; 0 = the
#: directions train apart, in parallel on a CPU)
AGREEMENT_WEIGHT = 0.0
#: epochs per direction of one plain training (`align train --rounds 1`, and the kinds that
#: cannot self-train)
EPOCHS = 2
#: self-training rounds (aligner/training/rounds.py) of `align train` (hmm0, hmm1) and `align
#: run`, round 1 of EPOCHS_PER_ROUND epochs (teacher_enfr.md)
ROUNDS = 2
EPOCHS_PER_ROUND = 1
#: on a bitext of fewer lines a round repeats its epochs until it has passed over about this
#: many pairs (round_epoch_repeats): at 1,000 pairs one epoch is 38 updates, and the rounds
#: left the model untrained (48 AER on en-fr dev against eflomal's 13; learning_curve_enfr.md)
ROUND_MIN_PAIRS = 25000
#: ... at most this many times (1,237 lines, the smallest bitext measured, repeat 21 times)
ROUND_MAX_REPEATS = 25
#: round 1 is guided by a classical teacher's links of its lines (aligner/training/teacher.py),
#: their soft-average at TEACHER_THRESHOLD, at TEACHER_GUIDE_WEIGHT (teacher_enfr.md)
TEACHER = True
TEACHER_THRESHOLD = 0.5
#: weight of --guide's cross-entropy term: the direct HMMs' and the guided alignment layer's
#: (alignment_layer.md)
GUIDE_WEIGHT = 1.0
LAYER_GUIDE_WEIGHT = 10.0
TEACHER_GUIDE_WEIGHT = GUIDE_WEIGHT
#: a round after the first fine-tunes the previous round's model (`align train --init-from`)
#: instead of training new weights (selftrain_finetune_enfr.md), for FINE_TUNE_EPOCHS epochs
#: with a linearly decaying learning rate (lr_schedule_enfr.md)
FINE_TUNE_ROUNDS = True
FINE_TUNE_EPOCHS = 1
FINE_TUNE_LR_SCHEDULE = "linear"
#: weight of the guide term in a round after the first, whose guide is the previous round's
#: own alignments (selftrain_finetune_enfr.md)
SELF_GUIDE_WEIGHT = 0.5
#: -H soft-average threshold of those alignments (selftrain_rounds_enfr.md)
SELF_GUIDE_THRESHOLD = 0.5
#: W of those alignments' mixture with the teacher (rounds/0; aligner/extract/mixture.py, as the
#: output's MIX_WEIGHT, with its long-line length and TEACHER_MIX_THRESHOLD): 0 = the round's
#: network alone. 0.25 moved ja-en dev by -0.11 / +0.11 and bicici100 by -0.29 / -0.01 (seeds
#: 1 / 2), the held-out de-en test +0.45 / +0.65 (guide_mix.md)
SELF_GUIDE_MIX_WEIGHT = 0.0
#: lines each round trains on, a sample drawn anew per round (aligner/training/samples.py): a
#: bitext of at most this many lines trains on all of it (scale_enfr.md, round_pairs_deen.md)
ROUND_PAIRS = 40000
#: lines the classical teacher trains on: all of a bitext of at most this many, else a sample
#: that holds round 1's lines (the first TEACHER_PAIRS of the permutation whose first
#: ROUND_PAIRS are round 1's; aligner/training/samples.py). The output mixes the teacher into
#: every line (MIX_WEIGHT), so it should have seen the words of the lines it aligns: ja-en
#: (50,291 lines), whose dev lines' words a teacher of round 1's 40,000 lines partly misses,
#: 61.1 -> 59.6 on dev (seed 1; mix_length.md). The cap is the teacher's memory: its EM keeps
#: every line's lexicon positions: its process peaked at 1.98 GiB on 60,000 Hansards lines,
#: 2.73 GiB on 100,000 (1.5 GiB on 40,000); 1.5 GiB on 60,000 since its positions are kept for
#: the real cells only (teacher_memory.md). With --join-lines it counts joined runs, as
#: ROUND_PAIRS does; with --round-pairs 0 (every round on all lines) the teacher too takes
#: every line
TEACHER_PAIRS = 60000
#: the share of the bitext each fine-tuned round trains on, at most ROUND_PAIRS lines
#: (fine_tune_share_enfr.md)
FINE_TUNE_SHARE = 1.0
#: agreement weight of the last round (0 = apart, as the other rounds;
#: final_agreement_enfr.md)
FINAL_AGREEMENT_WEIGHT = 0.0
#: training pairs of the recipe's kind with a side longer than this many subwords are skipped;
#: every line is still aligned (train_max_len_enfr.md)
TRAIN_MAX_LEN = 200
#: the same cap for the other kinds (the transformer, the alignment layer: DataConfig's default)
OTHER_KINDS_MAX_LEN = 200
#: the guided alignment layer's own stage (stage 2, on its frozen base): its epochs where
#: --max-epochs is not given and its decay where --lr-schedule is not given; its base keeps
#: EPOCHS and TRAINING's schedule (alignment_layer.md)
LAYER_EPOCHS = 8
LAYER_LR_SCHEDULE = "linear"
#: the output: the kind's posteriors, both directions combined by soft-average (enfr_hmm1.md)
METHOD = "hmm-posterior"
HEURISTIC = "soft-average"
#: -H soft-average threshold of the output after self-training rounds (`align run`'s, and
#: `align extract`'s default for the model directory; one round: 0.5; selftrain_rounds_enfr.md,
#: rounds4_enfr.md)
THRESHOLD = 0.55
#: ... for its lines of under 15 words; after the rounds the output is calibrated on the
#: bitext: a longer line's threshold is THRESHOLD scaled by how the model's own posteriors
#: spread with length, the ratio of its length bucket's expected-F_beta threshold (beta
#: CALIBRATION_BETA, CALIBRATION_LINES lines per bucket) to the shortest lines'
#: (aligner/links/calibration.py; calibrated_thresholds.md)
CALIBRATION_BETA = 0.7
CALIBRATION_LINES = 300
#: the output's lexicon shortlist: each sentence's lexicon normalized over the SHORTLIST most
#: frequent target subwords and its own instead of the vocabulary (`align run`'s final
#: alignment, `align extract`'s and the API's default): the smallest of 250-4,000 within 0.1
#: of the exact lexicon's AER on the dev sets (profile_extract.md); the self-training rounds'
#: guides stay exact (GUIDE_SHORTLIST)
SHORTLIST = 2000
GUIDE_SHORTLIST = 0
#: how the output's soft matrices combine a word's subwords (aligner.extract.inference
#: word_matrix; `align run`'s final alignment and calibration and `align calibrate`'s default;
#: `align extract` and the API take the one the model directory was calibrated with): a word
#: pair gets the highest of the word's subwords' probabilities, not their mean, which halves a
#: link wherever a word's subwords align apart (a German compound to two English words).
#: Chosen on en-fr dev, de-en bicici100 and ja-en dev, two seeds each: better on bicici100 and
#: ja-en dev, within 0.1 on en-fr dev (subword_pooling.md). The self-training rounds' guides
#: keep the mean (GUIDE_SUBWORD_POOLING): the rounds train as they did.
SUBWORD_POOLING = "max"
GUIDE_SUBWORD_POOLING = "mean"
#: W of the output's mixture: each direction's soft matrices (1 - W) · the network's + W · the
#: teacher's (MODEL/rounds/0; `align extract --mix OTHER` without --mix-weight: OTHER's;
#: aligner/extract/mixture.py). Chosen with the classical aligner of the same bitext as the
#: W of 0.1-0.4 that lowers the recipe's AER most on average over en-fr dev, de-en bicici100
#: and ja-en dev (two seeds each, relative to each set's); on the `align run` models' own
#: teachers 0.15-0.25 are within 0.2 points of each other by that rule, and 0.25 leads
#: eflomal on ja-en dev where 0.15 does not (mix_classical.md)
MIX_WEIGHT = 0.25
#: ... on lines up to the long-line length L the recipe records: this quantile of its
#: bitext's line lengths (longer side, words); longer lines weigh the teacher more, alone from
#: 2L words on (aligner/extract/mixture.py line_weight; mix_length.md)
MIX_LENGTH_QUANTILE = 0.99
#: ... and the teacher's share of a line judged at this threshold (aligner/extract/mixture.py
#: Mixture.thresholds), below its guide's TEACHER_THRESHOLD: its rows keep the empty word's
#: mass, so its posteriors run lower than the network's renormalized ones (0.45 = 0.5 · (1 -
#: p0)). Chosen on en-fr dev, de-en bicici100 and ja-en dev, two seeds each, among 0.5, 0.45,
#: 0.4 and 0.35: the one that is better on bicici100 and ja-en dev and within 0.1 on en-fr
#: dev on both seeds (mix_threshold.md)
TEACHER_MIX_THRESHOLD = 0.45

#: the direct HMM's transition-score budget (DirectHMMConfig.chunk_floats: floats alive at
#: once before training chunks and recomputes them) on the CPU: the model's own default,
#: 2^24 floats = 64 MiB
CPU_CHUNK_FLOATS = 1 << 24
#: on a CUDA GPU: 2^28 floats = 1 GiB per float32 score tensor (gpu_enfr.md)
GPU_CHUNK_FLOATS = 1 << 28
#: batches and learning rate on a CUDA GPU: TRAINING's, as on the CPU (gpu_enfr.md; the fast
#: setting, about 1.5 points of AER for time: --max-tokens 12000 --lr 6e-3 --warmup 15)
GPU_TRAINING = {key: TRAINING[key] for key in ("max_tokens", "lr", "warmup")}


def device_defaults(device: Any) -> Dict[str, Any]:
    """The settings of `align train` / `align run` that depend on the device: ``max_tokens``,
    ``lr`` and ``warmup`` (TrainConfig) and ``chunk_floats`` (the direct HMM's
    DirectHMMConfig), for `device` (a torch.device, or its name: "cpu", "cuda", "cuda:1").
    A pure function of the device's type: nothing is asked of CUDA.

    The CPU (and every device but CUDA): TRAINING's values as measured, and the model's
    chunk budget. CUDA: :data:`GPU_TRAINING` (TRAINING's batches, rate and warm-up: see its
    comment for what was measured on an H100) and :data:`GPU_CHUNK_FLOATS`. Values the user
    gives (--max-tokens, --lr, --warmup, -M chunk_floats=N) win over these.
    """
    kind = getattr(device, "type", None) or str(device).split(":", 1)[0]
    if kind != "cuda":
        return dict(max_tokens=TRAINING["max_tokens"], lr=TRAINING["lr"],
                    warmup=TRAINING["warmup"], chunk_floats=CPU_CHUNK_FLOATS)
    return dict(GPU_TRAINING, chunk_floats=GPU_CHUNK_FLOATS)


#: joint BPE merges: one per BPE_PAIRS_PER_MERGE training pairs, rounded to thousands, between
#: BPE_MERGES_MIN and BPE_MERGES_MAX (Zenkel et al.'s 10k for large data; PrepConfig's default)
BPE_PAIRS_PER_MERGE = 5
BPE_MERGES_MIN = 1000
BPE_MERGES_MAX = 10000
#: the classical aligner (--model classical; prep.json "lowercase", as --lowercase does for
#: any kind) and so the recipe's teacher lowercase their words: the lexicon is a table of
#: words, where "Haus" and "haus" are two rarer words, and a rare word is what a
#: maximum-likelihood lexicon aligns worst. de-en bicici100 (lowercased gold lines in a cased
#: bitext) 27.5 -> 18.5 AER, en-fr dev 8.4 -> 7.9 (classical_lowercase.md); the recipe with
#: the lowercased teacher: en-fr dev 5.09 / 4.82 -> 4.74 / 4.94, bicici100 16.56 / 15.83 ->
#: 15.70 / 14.85 (teacher_lowercase.md)
CLASSICAL_LOWERCASE = True
#: the recipe's network (a neural kind with self-training rounds: align run, align train
#: --rounds N) lowercases its words too: a word's subwords are learned from both cases'
#: counts, and the lowercased gold lines of bicici100 are no longer made of words the cased
#: bitext hardly has ("kommissar", "richtlinie"): de-en bicici100 14.37 / 13.61 -> 12.54 /
#: 13.14, en-fr dev 4.84 / 4.41 -> 4.49 / 4.80 (the mean 4.63 -> 4.65; network_lowercase.md).
#: A neural model trained in one round (the plain transformer, a model that translates)
#: keeps case unless --lowercase is given
NETWORK_LOWERCASE = True


def round_epoch_repeats(n_pairs: int) -> int:
    """How many times each epoch of a self-training round is repeated on a round of `n_pairs`
    lines: ceil(ROUND_MIN_PAIRS / n_pairs), from 1 (25,000 lines on) to ROUND_MAX_REPEATS."""
    return min(ROUND_MAX_REPEATS, max(1, -(-ROUND_MIN_PAIRS // max(1, n_pairs))))


def bpe_merges(n_pairs: int) -> int:
    """Joint BPE merges for a corpus of `n_pairs`: 5,000 at 25k pairs (the recipe), one per five
    pairs, rounded to thousands, between 1,000 and 10,000."""
    return int(min(BPE_MERGES_MAX, max(BPE_MERGES_MIN,
                                       round(n_pairs / BPE_PAIRS_PER_MERGE, -3))))


#: `align demo`: the recipe's job (its teacher and self-training rounds, its output) at the
#: size of the shipped sample (3,037 pairs), in a minute or two on 2 CPU cores. Only these
#: settings differ from the recipe's: a smaller model, batches and a learning rate chosen for
#: the most progress per CPU second on 3,000 pairs, and 1,000 BPE merges; round 1 trains
#: DEMO_EPOCHS epochs (its --max-epochs), the rounds after it FINE_TUNE_EPOCHS each, as the
#: recipe's (eval/results/demo_sample.md)
DEMO_MODEL_OPTIONS: Dict[str, Any] = dict(d_model=64, enc_layers=2, dec_layers=2, d_ff=256,
                                          max_positions=256)
DEMO_TRAINING: Dict[str, Any] = dict(max_tokens=800, lr=5e-3, warmup=100, label_smoothing=0.0)
DEMO_EPOCHS = 2
DEMO_BPE_MERGES = 1000
