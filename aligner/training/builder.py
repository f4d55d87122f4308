"""The one builder of training jobs: what `align train`, `align run` and `align demo` were
given, made into round 1's :class:`~aligner.training.request.TrainRequest` and the
:class:`~aligner.training.request.SelfTraining` plan of the rounds (:func:`build_job`; the
alignment layer's stage 0 builds the recipe's job with it too, aligner/training/recipe_guide.py).

The commands only parse their options and pass what was given; every setting left out (None,
or the parameter's default) is resolved here, from the recipe (aligner/training/recipe.py),
from the device (:func:`device_defaults`: batches, learning rate, warm-up, the direct HMM's
chunk budget; for a resumed run, the run's own) or from the model kind (the training length
cap, the guide weight, the rounds, the alignment layer's own stage).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from aligner import constants as C
from aligner.config import CHECKPOINT_AT_THE_END, DataConfig, TrainConfig
from aligner.distributed import resolve_device
from aligner.formats import Bitext, GoldAlignment
from aligner.links.soft_symmetrize import DEFAULT_THRESHOLD
from aligner.models import model_class
from aligner.prep import PrepConfig
from aligner.training import recipe
from aligner.training.directions import default_parallel_directions
from aligner.training.joined_text import join_bitext, joined_round_pairs
from aligner.training.request import SelfTraining, TrainRequest, output_settings
from aligner.training.rounds import check_rounds, default_rounds
from aligner.utils import AlignerError, check_condition


def device_defaults(device_type: str, model_dir: Optional[str], resume: bool
                    ) -> Dict[str, Any]:
    """max_tokens, lr, warmup and chunk_floats for the options the user left out:
    :func:`aligner.training.recipe.device_defaults` of the device type ("cpu", "cuda"); with
    `resume` of a run whose config.json is there (MODEL_DIR's, or, for a self-training run
    cut off before its last round, round 1's: every round trains with its batches), the
    run's own values (a run resumed on another device goes on with its batches: the batcher
    refuses another max_tokens, and the settings check another lr), chunk_floats None when
    its models were given none. A config.json that cannot be read leaves the device's values
    (the run's own checks report it)."""
    values: Dict[str, Any] = recipe.device_defaults(device_type)
    if not (resume and model_dir):
        return values
    path = next((path for path in (os.path.join(model_dir, C.CONFIG_NAME),
                                   os.path.join(model_dir, C.ROUNDS_DIR, "1", C.CONFIG_NAME))
                 if os.path.isfile(path)), None)
    if path is None:
        return values
    try:
        with open(path, encoding="utf-8") as handle:
            saved = json.load(handle)
        training, models = saved["training"], saved["models"]
        values.update({key: training[key] for key in ("max_tokens", "lr", "warmup")
                       if key in training})
        chunks = [m["chunk_floats"] for m in models.values() if "chunk_floats" in m]
        values["chunk_floats"] = chunks[0] if chunks else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return values


def training_settings(by_device: Dict[str, Any], max_tokens: Optional[int], lr: Optional[float],
                      warmup: Optional[int], resume: bool) -> Dict[str, Any]:
    """max_tokens, lr and warmup of a training: each the user's where given, else the device's
    (`by_device`: :func:`device_defaults`). The device's warm-up goes with its batches: a
    --max-tokens of the user's without --warmup takes TRAINING's warm-up (not on --resume,
    where `by_device` holds the run's own)."""
    if warmup is None:
        warmup = (by_device["warmup"] if max_tokens is None or resume
                  else recipe.TRAINING["warmup"])
    return dict(max_tokens=by_device["max_tokens"] if max_tokens is None else max_tokens,
                lr=by_device["lr"] if lr is None else lr, warmup=warmup)


def device_chunk_floats(model_options: Dict[str, Any], fields: Any,
                        chunk_floats: Optional[int]) -> None:
    """Give the direct HMM's chunk_floats (:func:`device_defaults`) to `model_options` when the
    model kind has the setting (`fields`: its config's fields), -M did not give it and it is
    not the model's own default (a CPU run's config.json stays as it was)."""
    if ("chunk_floats" in fields and "chunk_floats" not in model_options
            and chunk_floats is not None and chunk_floats != recipe.CPU_CHUNK_FLOATS):
        model_options["chunk_floats"] = chunk_floats


def resolve_max_len(max_len: Optional[int], default: int, longest: int,
                    may_exceed: bool = False) -> int:
    """--max-len: the value given, else `default` clipped to `longest` (the subwords a side
    the model takes: max_positions - 1). A value given above `longest` is refused in one
    line, unless `may_exceed` (--base, --init-from: the model's own size is not known here)."""
    if max_len is None:
        return min(default, longest)
    check_condition(max_len <= longest or may_exceed,
                    f"--max-len {max_len}: the model takes at most {longest} subwords a side "
                    f"(max_positions {longest + 1}); lower --max-len or raise max_positions")
    return max_len


def resolve_guide_weight(guide_weight: Optional[float], guided: bool, model_kind: str
                         ) -> float:
    """--guide-weight as given, else the kind's (recipe.GUIDE_WEIGHT; LAYER_GUIDE_WEIGHT for a
    kind trained on a frozen base, the alignment layer); 0 unless the run is `guided` (a
    --guide, or the alignment layer's recipe guide). A non-zero --guide-weight given to a run
    with no guide is refused (it would change nothing; a self-training round's weight is
    --self-guide-weight)."""
    if not guided:
        if guide_weight:   # (0 changes nothing either way)
            raise AlignerError(f"--guide-weight {guide_weight:g}: this run has no guide "
                               f"(give --guide FILE; self-training rounds take "
                               f"--self-guide-weight)")
        return 0.0
    if guide_weight is not None:
        return guide_weight
    return (recipe.LAYER_GUIDE_WEIGHT if model_class(model_kind).BASE_KIND is not None
            else recipe.GUIDE_WEIGHT)


def resolve_final_agreement_weight(given: Optional[float], rounds: int) -> float:
    """The last round's agreement weight of a run of `rounds` rounds: the one `given`
    (--final-agreement-weight; a run of one round then refuses it), else the recipe's for
    two or more rounds, 0 for one."""
    if given is not None:
        return given
    return recipe.FINAL_AGREEMENT_WEIGHT if rounds > 1 else 0.0


def build_job(model_dir: str, bitext: Bitext, *, model_kind: str = recipe.MODEL_KIND,
              directions: Sequence[str] = C.DIRECTIONS,
              model_options: Optional[Dict[str, Any]] = None,
              prep_options: Optional[Dict[str, Any]] = None, bpe_merges: Optional[int] = None,
              max_len: Optional[int] = None, max_ratio: float = DataConfig.max_ratio,
              guide: Optional[str] = None, guide_weight: Optional[float] = None,
              max_tokens: Optional[int] = None, lr: Optional[float] = None,
              warmup: Optional[int] = None, lr_schedule: Optional[str] = None,
              max_epochs: Optional[int] = None, max_updates: int = 0,
              training: Optional[Dict[str, Any]] = None, join_lines: Optional[int] = None,
              agreement_weight: float = recipe.AGREEMENT_WEIGHT,
              rounds: Optional[int] = None, self_training: Optional[Dict[str, Any]] = None,
              threshold: Optional[float] = None,
              final_agreement_weight: Optional[float] = None, record_output: bool = False,
              parallel_directions: Optional[bool] = None, one_thread_each: bool = False,
              device: str = "auto", precision: str = "auto", deterministic: bool = False,
              seed: int = C.DEFAULT_SEED, base_dir: Optional[str] = None,
              init_dir: Optional[str] = None, valid_bitext: Optional[Bitext] = None,
              valid_gold: Optional[List[GoldAlignment]] = None, resume: bool = False,
              overwrite: bool = False, quiet: bool = False, verbose: bool = False,
              argv: Sequence[str] = (), ignore_data_change: bool = False,
              epoch_repeats: Optional[int] = None) -> Tuple[TrainRequest, SelfTraining]:
    """Round 1's request and the rounds' plan of a training of `model_kind` on `bitext` into
    `model_dir`; with no setting given, the recipe's job (what `align run` trains).

    model_options: the model settings given (flags, -M), over the recipe's
    (recipe.MODEL_OPTIONS, those the kind has; for the recipe's kind with rounds that repeat
    their epochs recipe.SMALL_MODEL_REPEATS times or more, recipe.SMALL_MODEL_OPTIONS over
    them), then the device's chunk budget; the guided
    alignment layer gets ``layer_query`` "target" unless given. prep_options: PrepConfig's
    fields given (tokenization, languages, ...; lowercase None: recipe.CLASSICAL_LOWERCASE for
    the classical aligner, recipe.NETWORK_LOWERCASE for a neural kind with self-training
    rounds, off for one round); bpe_merges None: recipe.bpe_merges of the
    number of pairs. max_len None: the recipe's cap for its kind (DataConfig's for the
    others), within what the model takes. guide / guide_weight: round 1's --guide and its
    weight (None: the kind's, when guided). max_tokens / lr / warmup None: the device's
    (:func:`device_defaults`). lr_schedule None: the recipe's (the guided layer's own stage:
    recipe.LAYER_LR_SCHEDULE). max_epochs None: recipe.EPOCHS for one round, else
    recipe.EPOCHS_PER_ROUND a round (none with max_updates; the guided layer's own stage:
    recipe.LAYER_EPOCHS); with self-training rounds (and no max_updates) max_epochs and the
    rounds' fine_tune_epochs are multiplied by `epoch_repeats` (None: the recipe's
    round_epoch_repeats of a round's lines: a round on a small bitext repeats its epochs). training: other TrainConfig fields given (update_freq,
    label_smoothing, clip_norm, checkpoint_interval, valid_method, and a command's own
    max_tokens / lr / warmup), over the recipe's TRAINING, the device's and a checkpoint at
    the end only. rounds None: :func:`~aligner.training.rounds.default_rounds`.
    self_training: SelfTraining's fields given (guide_weight, heuristic, teacher, ...).
    threshold None: the output's soft-average threshold, recipe.THRESHOLD after rounds (for
    the shortest lines: calibrated per line length), else 0.5; record_output: the output's heuristic and threshold go into config.json as `align
    extract`'s defaults even for one round (`align run`; the last of several rounds records
    them anyway). parallel_directions None: side by side where faster
    (:func:`~aligner.training.directions.default_parallel_directions`, `one_thread_each` for
    `align demo`). The rest is passed on as the request's fields.
    """
    cls = model_class(model_kind)   # one line for an unknown kind
    n_lines = len(bitext)
    fields = cls.config_class.__dataclass_fields__
    if rounds is None:
        rounds = default_rounds(model_kind, directions)
    check_rounds(model_kind, directions, rounds)
    if join_lines is None:   # the recipe's teacher-guided rounds: as measured
        join_lines = recipe.JOIN_LINES if guide is None and rounds > 1 else 1
    check_condition(join_lines <= 1 or guide is None,
                    f"--join-lines {join_lines} joins the bitext's lines, which --guide's links "
                    f"are of: give --join-lines 1 with --guide")
    given_bitext, bitext = bitext, join_bitext(bitext, join_lines, recipe.JOIN_WORDS, seed)
    if bitext is not given_bitext:   # a round's sample: as many lines as unjoined
        self_training = dict(self_training or {})
        self_training["round_pairs"] = joined_round_pairs(
            self_training.get("round_pairs", recipe.ROUND_PAIRS), bitext)
    options = {key: value for key, value in recipe.MODEL_OPTIONS.items() if key in fields}
    options.update(model_options or {})
    torch_device = resolve_device(device)
    by_device = device_defaults(torch_device.type, model_dir, resume)
    device_chunk_floats(options, fields, by_device["chunk_floats"])
    # the alignment layer is guided by default (Zenkel et al. 2020): by --guide, else by the
    # recipe's links of the bitext (stage 0, aligner/training/recipe_guide.py); layer_query
    # "prefix" is the unguided layer of 2019
    layer = "layer_keys" in fields
    recipe_guide = layer and guide is None and options.get("layer_query") != "prefix"
    guided_layer = layer and (guide is not None or recipe_guide)
    layer_training: Dict[str, Any] = {}
    if guided_layer:
        # a guided layer sees the word it aligns (aligner/models/alignment_layer.py)
        options.setdefault("layer_query", "target")
        # its own stage: LAYER_EPOCHS where max_epochs is not given (with max_updates,
        # whichever limit comes first, as for its base's EPOCHS), the linear decay where
        # lr_schedule is not given
        if max_epochs is None:
            layer_training["max_epochs"] = recipe.LAYER_EPOCHS
        if lr_schedule is None:
            layer_training["lr_schedule"] = recipe.LAYER_LR_SCHEDULE
    if max_epochs is None:   # with rounds: max_updates alone decides
        max_epochs = (recipe.EPOCHS if rounds == 1 else 0 if max_updates
                      else recipe.EPOCHS_PER_ROUND)
    if rounds > 1 and not max_updates:   # a small bitext: each round's epochs repeated
        round_pairs = (self_training or {}).get("round_pairs", recipe.ROUND_PAIRS)
        round_lines = len(bitext) if round_pairs <= 0 else min(len(bitext), round_pairs)
        if epoch_repeats is None:
            epoch_repeats = recipe.round_epoch_repeats(round_lines)
        max_epochs *= epoch_repeats
        self_training = dict(self_training or {})
        self_training["fine_tune_epochs"] = epoch_repeats * self_training.get(
            "fine_tune_epochs", recipe.FINE_TUNE_EPOCHS)
        if model_kind == recipe.MODEL_KIND and epoch_repeats >= recipe.SMALL_MODEL_REPEATS:
            # many passes over few lines: the smaller network with dropout, under what is given
            options.update({key: value for key, value in recipe.SMALL_MODEL_OPTIONS.items()
                            if key in fields and key not in (model_options or {})})
    # longer pairs are skipped in training; every line is aligned
    max_len = resolve_max_len(
        max_len, recipe.TRAIN_MAX_LEN if model_kind == recipe.MODEL_KIND else DataConfig.max_len,
        int(options["max_positions"]) - 1,   # subwords + EOS
        may_exceed=(base_dir or init_dir) is not None)
    train_config = TrainConfig(**{
        **recipe.TRAINING, "checkpoint_interval": CHECKPOINT_AT_THE_END,
        **training_settings(by_device, max_tokens, lr, warmup, resume), **(training or {}),
        "lr_schedule": lr_schedule or recipe.TRAINING["lr_schedule"],
        "max_epochs": max_epochs, "max_updates": max_updates, "device": device,
        "precision": precision, "deterministic": deterministic, "seed": seed,
        "guide_weight": resolve_guide_weight(guide_weight, guide is not None or recipe_guide,
                                             model_kind),
        "agreement_weight": agreement_weight})
    if bpe_merges is None:   # the classical aligner's units are words
        bpe_merges = 0 if cls.TRAINED_BY_EM else recipe.bpe_merges(n_lines)
    prep_options = dict(prep_options or {})
    if prep_options.get("lowercase") is None:   # the classical aligner's and the recipe's
        prep_options["lowercase"] = bool(recipe.CLASSICAL_LOWERCASE if cls.TRAINED_BY_EM
                                         else recipe.NETWORK_LOWERCASE and rounds > 1)
    prep_config = PrepConfig(**prep_options, bpe_merges=bpe_merges)
    final_agreement_weight = resolve_final_agreement_weight(final_agreement_weight, rounds)
    check_condition(not (parallel_directions and final_agreement_weight > 0 and rounds > 1),
                    "--final-agreement-weight trains the last round's directions in one loop: "
                    "it cannot be combined with --parallel-directions")
    if parallel_directions is None:
        parallel_directions = default_parallel_directions(
            torch_device, directions, agreement_weight, len(bitext), one_thread_each)
    if threshold is None:   # self-trained posteriors are sharper: the best threshold is higher
        threshold = recipe.THRESHOLD if rounds > 1 else DEFAULT_THRESHOLD
    plan = SelfTraining(rounds=rounds, output_threshold=threshold,
                        final_agreement_weight=final_agreement_weight,
                        **(self_training or {}))
    request = TrainRequest(
        model_dir, bitext, model_kind, options, prep_config,
        DataConfig(max_len=max_len, max_ratio=max_ratio, guide=guide or ""), train_config,
        directions=tuple(directions), valid_bitext=valid_bitext, valid_gold=valid_gold,
        resume=resume, overwrite=overwrite, quiet=quiet, verbose=verbose, argv=argv,
        base_dir=base_dir, parallel_directions=parallel_directions,
        ignore_data_change=ignore_data_change, init_dir=init_dir, recipe_guide=recipe_guide,
        layer_training=layer_training if guided_layer else None,
        extra=({C.ALIGN_RUN_SETTINGS: output_settings(plan.heuristic, plan.output_threshold)}
               if record_output else None))
    return request, plan
