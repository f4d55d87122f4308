"""Names and numbers shared across the package: special tokens, model-directory files, defaults."""

# Special token ids, identical in every vocabulary.
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)

# BPE continuation marker of subword-nmt ("Hans@@ ards" = "Hansards").
BPE_SEPARATOR = "@@"

# Directions. "fwd" models p(target | source), "rev" models p(source | target).
DIRECTIONS = ("fwd", "rev")

# Model directory layout (see aligner/model_dir.py).
MODEL_FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
VERSION_NAME = "version"
BPE_CODES_SRC = "bpe.src.codes"
BPE_CODES_TGT = "bpe.tgt.codes"
VOCAB_SRC = "vocab.src.json"
VOCAB_TGT = "vocab.tgt.json"
PARAMS_BEST = "params.best.pt"
PARAMS_LAST = "params.last.pt"
TRAINING_STATE = "training_state.pt"
METRICS_NAME = "metrics.tsv"
LOG_NAME = "train.log"
#: the run record: the command, inputs and seconds of each stage (aligner/training/run_record.py)
RUN_RECORD_NAME = "run.json"
#: the output's thresholds per line length, calibrated on the training bitext
#: (aligner/extract/calibrate.py)
CALIBRATION_NAME = "calibration.json"
#: the parts folder of `align run`'s final alignment: each finished block's output lines,
#: kept until the outputs are complete, so that --resume goes on from the first unfinished
#: block (aligner/extract/blocks.py)
ALIGNMENT_PARTS = "alignment.parts"
#: the parts folder of another alignment is its output's name plus this (`align extract -o
#: FILE`: FILE.parts; a self-training guide: MODEL_DIR/rounds/N/links.align.parts)
PARTS_SUFFIX = ".parts"
#: a self-training run's rounds (aligner/training/rounds.py): MODEL_DIR/rounds/N is round N's
#: model directory; in it, links.align its links of round N+1's lines (round N+1's guide) and
#: done once its training has ended; MODEL_DIR/rounds/settings.json the run's plan
ROUNDS_DIR = "rounds"
ROUND_LINKS = "links.align"
ROUND_DONE = "done"
ROUND_SETTINGS = "settings.json"

# Symmetrization heuristics (Koehn et al. 2005; fast_align `atools -c`).
HEURISTICS = ("intersect", "union", "grow-diag", "grow-diag-final", "grow-diag-final-and")
DEFAULT_HEURISTIC = "grow-diag"
# Combine the two directions' soft alignments instead of their links
# (aligner.links.soft_symmetrize).
SOFT_HEURISTICS = ("soft-average",)
#: how a word's row of a soft matrix combines the rows of its subwords on the model's
#: decoder side (aligner.extract.inference.word_matrix): their mean, or their maximum
SUBWORD_POOLINGS = ("mean", "max")
#: config.json ``extra`` key where `align run` (and a self-training `align train`,
#: aligner/training/rounds.py) records the -H and --threshold of its output
#: ({"symmetrize": ..., "threshold": ...}): `align extract` takes them as its defaults for that
#: model directory, so that it gives the same links on the same text (with the same
#: --shortlist, which is not recorded)
ALIGN_RUN_SETTINGS = "align_run"

DEFAULT_SEED = 1
#: learning-rate decays after the warm-up (TrainConfig.lr_schedule;
#: aligner.training.loop.learning_rate)
LR_SCHEDULES = ("inverse-sqrt", "linear")
#: --precision of align train / run / extract / translate (aligner.precision): ``auto``
#: resolves to one of the other two by device
PRECISIONS = ("auto", "fp32", "bf16")
