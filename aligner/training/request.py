"""What a training job is: the request of one model directory's training, and the plan of the
self-training rounds around it.

The types that every level of aligner/training/ passes on, at the bottom of its imports:
:func:`aligner.training.run.train` trains one :class:`TrainRequest`'s model directory,
:func:`aligner.training.rounds.train_rounds` trains the rounds of a :class:`SelfTraining` plan
(each round's request derived from round 1's), :mod:`aligner.training.recipe_guide` the stages
of the alignment layer; :func:`aligner.training.builder.build_job` makes both from the options
of `align train`, `align run` and `align demo`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from aligner import constants as C
from aligner.config import DataConfig, TrainConfig
from aligner.formats import Bitext, GoldAlignment
from aligner.training import recipe

if TYPE_CHECKING:  # pragma: no cover
    from aligner.prep import PrepConfig
    from aligner.training.run_record import RunRecord


@dataclass(frozen=True)
class TrainRequest:
    """The training of one model directory, as :func:`aligner.training.run.train` takes it
(round 1's of a self-training run, whose rounds derive theirs from it).

    model_dir: where the run goes; bitext: the training pairs; model_kind / model_options: the
    model config without vocabulary sizes (those come from the data); prep_config, data_config,
    train_config: preprocessing, corpus filtering / guide, training. directions: the models to
    train. valid_bitext / valid_gold: optional validation pairs (words as in `bitext`) and
    their gold alignments. resume / overwrite: continue or replace an earlier run in
    `model_dir`; ignore_data_change: with `resume`, continue on the cached corpus even if
    `bitext` differs (aligner.training.corpus.check_inputs). quiet / verbose: console logging; argv:
    the command line, logged. extra: more settings for config.json's ``extra``. base_dir: a
    trained base model directory for a kind trained on a frozen base (``align train --base``).
    parallel_directions: each direction in a process of its own (aligner/training/directions.py).
    init_dir: a trained model directory of the same kind to start from (``align train
    --init-from``, fine-tuning): its preprocessing, vocabularies, model configs and best
    weights; `prep_config` and `model_options` are then not used. record: the run record the
    run adds its session and stages to (a self-training job's, kept across its rounds,
    aligner/training/rounds.py); None: a new one, or for `resume` MODEL_DIR/run.json's.
    recipe_guide: a kind trained on a frozen base, guided by the recipe's links of `bitext`
    (stage 0, aligner/training/recipe_guide.py: `align train --model alignment-layer` with no
    --guide); `data_config.guide` is then empty until that stage has written them, and
    :func:`~aligner.training.run.train` refuses the request.
    layer_training: TrainConfig fields that the kind's own stage (stage 2, on its frozen base)
    trains with instead of `train_config`'s, which its base (stage 1) keeps (the guided
    layer's epochs and schedule where not given: recipe.LAYER_EPOCHS, LAYER_LR_SCHEDULE,
    filled in by :func:`~aligner.training.builder.build_job`; None: both stages train with
    `train_config`).
    """

    model_dir: str
    bitext: Bitext
    model_kind: str
    model_options: Dict[str, Any]
    prep_config: "PrepConfig"
    data_config: DataConfig
    train_config: TrainConfig
    directions: Sequence[str] = C.DIRECTIONS
    valid_bitext: Optional[Bitext] = None
    valid_gold: Optional[List[GoldAlignment]] = None
    resume: bool = False
    overwrite: bool = False
    quiet: bool = False
    verbose: bool = False
    argv: Sequence[str] = ()
    extra: Optional[Dict[str, Any]] = None
    base_dir: Optional[str] = None
    parallel_directions: bool = False
    ignore_data_change: bool = False
    init_dir: Optional[str] = None
    record: Optional["RunRecord"] = None
    recipe_guide: bool = False
    layer_training: Optional[Dict[str, Any]] = None

    @property
    def agreement(self) -> bool:
        """Both directions trained together (--agreement-weight)."""
        return self.train_config.agreement_weight > 0



@dataclass(frozen=True)
class SelfTraining:
    """How the rounds after the first train (the defaults are the recipe's).

    rounds: rounds in all (1 = one plain training). guide_weight: weight of the guide term
    in rounds 2..N. guide_threshold: soft-average threshold of the links that guide the next
    round. heuristic: how the two directions' alignments are combined, for the guides and the
    output. output_threshold: the soft-average threshold recorded for `align extract` (the
    last round's model; for a soft heuristic, the threshold of the shortest lines, scaled
    for longer ones by the calibration written after the last round,
    aligner/extract/calibrate.py). fine_tune: round r+1 starts from round r's weights (else from new
    ones). guide_mix_weight: W of the teacher's posteriors mixed into a round's own for the
    links that guide the next round (aligner/extract/mixture.py; 0 = the round's alone; only
    where the run keeps its teacher, :func:`aligner.training.rounds.output_mix_weight`).
    fine_tune_epochs / fine_tune_lr_schedule: a fine-tuned round's passes over the
    bitext (unless the request limits updates) and learning-rate decay. shortlist: the
    lexicon shortlist of the guides' extraction (0 = exact). round_pairs: the lines each
    round trains on, a sample of the bitext drawn anew per round (aligner/training/samples.py; 0
    or more than the bitext has = all; round 1 trains on all when it has a --guide, which
    covers all). fine_tune_share: the share of the bitext rounds 2, 3, ... train on, at
    most round_pairs (1 = as round 1).
    block_lines: lines per block of the guides' alignment (0 = inference.BLOCK_LINES), the
    unit a guide cut off goes on from. final_agreement_weight: the last round (of two or
    more) trains both directions together, in one process, with this agreement weight
    (aligner/training/agreement.py; 0 = apart, as every other round); no round can follow
    it.
    """

    rounds: int = recipe.ROUNDS
    guide_weight: float = recipe.SELF_GUIDE_WEIGHT
    guide_threshold: float = recipe.SELF_GUIDE_THRESHOLD
    guide_mix_weight: float = recipe.SELF_GUIDE_MIX_WEIGHT
    heuristic: str = recipe.HEURISTIC
    output_threshold: float = recipe.THRESHOLD
    fine_tune: bool = recipe.FINE_TUNE_ROUNDS
    fine_tune_epochs: int = recipe.FINE_TUNE_EPOCHS
    fine_tune_lr_schedule: str = recipe.FINE_TUNE_LR_SCHEDULE
    shortlist: int = 0
    round_pairs: int = recipe.ROUND_PAIRS
    fine_tune_share: float = recipe.FINE_TUNE_SHARE
    block_lines: int = 0
    final_agreement_weight: float = recipe.FINAL_AGREEMENT_WEIGHT
    teacher: bool = recipe.TEACHER


def output_settings(heuristic: str, threshold: float, mix_weight: Optional[float] = None,
                    mix_length: Optional[int] = None) -> Dict[str, Any]:
    """What config.json records as `align extract`'s defaults
    (``extra[constants.ALIGN_RUN_SETTINGS]``): the heuristic and the threshold, and the
    weight of the teacher's posteriors mixed into the model's (aligner/extract/mixture.py)
    and its long-line length where the run keeps its teacher."""
    settings: Dict[str, Any] = {"symmetrize": heuristic, "threshold": threshold}
    if mix_weight is not None:
        settings["mix_weight"] = mix_weight
    if mix_length is not None:
        settings["mix_length"] = mix_length
    return settings
