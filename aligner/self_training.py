"""Self-training rounds: train, align the training bitext, train again guided by those links.

What `align train --rounds N` and `align run --rounds N` do (the recipe: four rounds,
aligner/recipe.py). Round 1 is the request as given (with its --guide, if any). After each
round but the last, the round's model aligns its own training bitext (the kind's first
extraction method, both directions combined by the plan's heuristic at ``guide_threshold``)
into ``MODEL_DIR/selftrain.round{r}.align`` (block by block through
``selftrain.round{r}.align.parts``: a guide cut off goes on from its last finished block),
and round r+1 trains guided by that file at
``guide_weight`` — fine-tuning round r's weights (``align train --init-from``; they are kept
aside in ``MODEL_DIR/previous_round`` while round r+1 rewrites the directory) for
``fine_tune_epochs`` with ``fine_tune_lr_schedule``, or from new weights (``fine_tune`` off).

The model directory ends as the last round's run; beside it stay each earlier round's links
and training log (``selftrain.round{r}.align`` / ``.log``); the run record (MODEL_DIR/run.json,
aligner/run_record.py) keeps every round's stages and their seconds, the guides' alignment
included. config.json records the round in
``extra["self_training"]`` and, for the last round, the output heuristic and threshold as
`align extract`'s defaults (``extra[constants.ALIGN_RUN_SETTINGS]``). ``selftrain.json`` names
the round that began last: ``--resume`` continues a run in the round it was cut off in, or
begins the next when that round's links are written (:func:`resume_point`).

Needs a kind that trains with a guide (hmm0, hmm1) and both directions. Under torchrun every
rank runs the rounds in one process group: each round trains through DDP
(aligner/train_run.py), the guide alignment between rounds is sharded over the ranks by
block (aligner/corpus_alignment.py), and rank 0 alone writes and moves the round files, the
others waiting for it in a barrier.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from aligner import constants as C
from aligner import faults, recipe
from aligner.config import RunConfig
from aligner.utils import AlignerError, atomic_output, check_condition

logger = logging.getLogger(__name__)

#: where the previous round's model is kept while the next round fine-tunes it
PREVIOUS_ROUND_DIR = "previous_round"
#: config.json ``extra`` key of a self-training round: {"round": r}
SELF_TRAINING_KEY = "self_training"
#: MODEL_DIR/selftrain.json: {"round": N, "trained": bool}, written when round N (N > 1)
#: begins, once its start is kept aside, and when its training ends: what --resume reads
STATE_NAME = "selftrain.json"


@dataclass(frozen=True)
class SelfTraining:
    """How the rounds after the first train (the defaults are the recipe's).

    rounds: rounds in all (1 = one plain training). guide_weight: weight of the guide term
    in rounds 2..N. guide_threshold: soft-average threshold of the links that guide the next
    round. heuristic: how the two directions' alignments are combined, for the guides and the
    output. output_threshold: the soft-average threshold recorded for `align extract` (the
    last round's model). fine_tune: round r+1 starts from round r's weights (else from new
    ones). fine_tune_epochs / fine_tune_lr_schedule: a fine-tuned round's passes over the
    bitext (unless the request limits updates) and learning-rate decay. shortlist: the
    lexicon shortlist of the guides' extraction (0 = exact). round_pairs: the lines each
    round trains on, a sample of the bitext drawn anew per round (aligner/round_samples.py; 0
    or more than the bitext has = all; round 1 trains on all when it has a --guide, which
    covers all). fine_tune_share: the share of the bitext rounds 2, 3, ... train on, at
    most round_pairs (1 = as round 1).
    block_lines: lines per block of the guides' alignment (0 = inference.BLOCK_LINES), the
    unit a guide cut off goes on from.
    """

    rounds: int = recipe.ROUNDS
    guide_weight: float = recipe.SELF_GUIDE_WEIGHT
    guide_threshold: float = recipe.SELF_GUIDE_THRESHOLD
    heuristic: str = recipe.HEURISTIC
    output_threshold: float = recipe.THRESHOLD
    fine_tune: bool = recipe.FINE_TUNE_ROUNDS
    fine_tune_epochs: int = recipe.FINE_TUNE_EPOCHS
    fine_tune_lr_schedule: str = recipe.FINE_TUNE_LR_SCHEDULE
    shortlist: int = 0
    round_pairs: int = recipe.ROUND_PAIRS
    fine_tune_share: float = recipe.FINE_TUNE_SHARE
    block_lines: int = 0


@dataclass
class RoundsResult:
    """What :func:`train_rounds` did: the last round's training summary per direction, and
    the seconds spent training and aligning the bitext (the guides), over every round."""

    summaries: Dict[str, "TrainSummary"]
    training_seconds: float = 0.0
    alignment_seconds: float = 0.0


def guide_path(model_dir: str, round_number: int) -> str:
    """MODEL_DIR/selftrain.round{N}.align: round N's links of the bitext, round N+1's guide."""
    return os.path.join(model_dir, f"selftrain.round{round_number}.align")


def _why_not_self_training(model_kind: str, directions: Sequence[str]) -> Optional[str]:
    """Why rounds after the first cannot align the bitext or train on it; None when they can."""
    from aligner.train_run import supports_guide

    if not supports_guide(model_kind):
        return (f"self-training trains with a guide, implemented for the direct HMMs (hmm0, "
                f"hmm1), not '{model_kind}'")
    if set(directions) != set(C.DIRECTIONS):
        return ("self-training guides a round by both directions' alignments; train "
                "--directions fwd,rev")
    return None


def default_rounds(model_kind: str, directions: Sequence[str]) -> int:
    """`align train`'s default --rounds: the recipe's for a kind that trains with a guide in
    both directions; 1 otherwise (the transformer, the alignment layer, one direction)."""
    return recipe.ROUNDS if _why_not_self_training(model_kind, directions) is None else 1


def check_rounds(model_kind: str, directions: Sequence[str], rounds: int) -> None:
    """Refuse (one line) rounds > 1 where a round cannot align the bitext or train on it."""
    if rounds > 1:
        reason = _why_not_self_training(model_kind, directions)
        check_condition(reason is None, f"--rounds {rounds}: {reason}")


def round_request(request: "TrainRequest", plan: SelfTraining, round_number: int
                  ) -> "TrainRequest":
    """The training request of round `round_number` (1-based) of `plan` on `request` (round
    1's; its resume flag is left to the caller)."""
    extra = dict(request.extra or {})
    bitext = training_lines(request, plan, round_number)
    if plan.rounds > 1:
        extra[SELF_TRAINING_KEY] = {"round": round_number}
        extra.pop(C.ALIGN_RUN_SETTINGS, None)
        if round_number == plan.rounds:   # the output's defaults, for align extract
            extra[C.ALIGN_RUN_SETTINGS] = {"symmetrize": plan.heuristic,
                                           "threshold": plan.output_threshold}
    if round_number == 1:
        return dataclasses.replace(request, bitext=bitext, extra=extra or None)
    model_dir, config = request.model_dir, request.train_config
    config = dataclasses.replace(config, guide_weight=plan.guide_weight)
    init_dir = None
    if plan.fine_tune:
        init_dir = os.path.join(model_dir, PREVIOUS_ROUND_DIR)
        config = dataclasses.replace(config, lr_schedule=plan.fine_tune_lr_schedule)
        if not config.max_updates:
            config = dataclasses.replace(config, max_epochs=plan.fine_tune_epochs)
    return dataclasses.replace(
        request, bitext=bitext, train_config=config, extra=extra, overwrite=True,
        init_dir=init_dir,
        data_config=dataclasses.replace(request.data_config,
                                        guide=guide_path(model_dir, round_number - 1)))


def training_lines(request: "TrainRequest", plan: SelfTraining, round_number: int):
    """The bitext round `round_number` of `plan` trains on (and the round before it aligns to
    guide it): ``request.bitext``, or its sample of ``plan.round_pairs`` lines for that round
    (aligner/round_samples.py) — not for one plain training, nor for a round 1 trained with
    the user's --guide (its lines are the whole bitext's)."""
    from aligner.round_samples import round_bitext

    if plan.rounds == 1 or (round_number == 1 and request.data_config.guide):
        return request.bitext
    return round_bitext(request.bitext, plan.round_pairs, request.train_config.seed,
                        round_number, plan.fine_tune_share)


def train_rounds(request: "TrainRequest", plan: SelfTraining) -> RoundsResult:
    """Train `plan.rounds` rounds into ``request.model_dir`` (see the module docstring);
    ``request`` is round 1's. With ``request.resume`` the directory's run continues where it
    was cut off (:func:`resume_point`). Under torchrun every rank calls this. Returns the last
    round's summaries and the time spent."""
    from aligner.distributed import distributed
    from aligner.train_run import train

    check_rounds(request.model_kind, request.directions, plan.rounds)
    if request.resume and plan.rounds == 1:   # one ordinary run: train() resumes it
        return RoundsResult(summaries=train(request))
    # one process group for every round: each round's training and guide alignment use it
    with distributed(request.train_config.device) as context:
        return _train_rounds_in_group(request, plan, context)


def _train_rounds_in_group(request: "TrainRequest", plan: SelfTraining,
                           context: "DistributedContext") -> RoundsResult:
    """:func:`train_rounds` inside the process group `context` (one process: a 1-rank
    context). Rank 0 alone writes, moves and removes round files; every rank trains and
    aligns its share of the guides."""
    from aligner.corpus_alignment import align_bitext
    from aligner.distributed import resolve_device
    from aligner.model_dir import BASE_DIR, LOCK_NAME, check_overwritable
    from aligner.models import model_class
    from aligner.precision import resolve_precision
    from aligner.run_record import RunRecord, record_path
    from aligner.train_run import (begin_record, check_request, request_inputs, run_inputs,
                                   train)

    model_dir = request.model_dir
    result = RoundsResult(summaries={})
    first, mode = resume_point(model_dir, plan) if request.resume else (1, FRESH)
    if mode == DONE:
        logger.info("%s: the run's last round is trained: nothing to resume", model_dir)
        return result
    # one record for every round (each rewrites the directory; the record goes on); rank 0's
    record = None
    if context.is_main:
        record = (RunRecord.resumed(model_dir) if request.resume
                  else RunRecord(record_path(model_dir)))
    if (mode == FRESH and request.overwrite and os.path.isdir(model_dir)
            and context.is_main):
        # everything checked before anything is removed: the request, and that the directory
        # holds a run of ours without the inputs in it
        check_request(round_request(request, plan, 1))
        if any(name not in (BASE_DIR, LOCK_NAME) for name in os.listdir(model_dir)):
            check_overwritable(model_dir, request_inputs(request))
        # an earlier run's round files must not be taken for this run's
        _remove_earlier_rounds(model_dir, keep=request.data_config.guide or None)
    context.barrier()
    for round_number in range(first, plan.rounds + 1):
        start = time.time()
        mode = mode if round_number == first else FRESH
        this_round = dataclasses.replace(
            round_request(request, plan, round_number), resume=mode == RESUME,
            overwrite=mode == RESTART or (mode == FRESH and (round_number > 1
                                                             or request.overwrite)),
            record=record)
        if record is not None:
            record.current_round = round_number
        if this_round.bitext is not request.bitext:
            logger.info("round %d trains on %s", round_number,
                        this_round.bitext.description)
        if round_number > 1:
            logger.info("self-training round %d of %d, guided by %s%s%s", round_number,
                        plan.rounds, this_round.data_config.guide,
                        ", from its model's weights" if plan.fine_tune else "",
                        {RESUME: " (resumed)", RESTART: " (again)",
                         TRAINED: " (trained)"}.get(mode, ""))
            if mode == FRESH:
                faults.reached("round-start")
            if mode == FRESH and context.is_main:   # this round rewrites the directory:
                _keep_round_log(model_dir, round_number - 1)   # keep what it starts from
                if plan.fine_tune:
                    _keep_previous_round(model_dir)
                _write_state(model_dir, round_number, plan)
            context.barrier()
        if mode == TRAINED:
            _check_trained_round(this_round, log_to_file=context.is_main)
            if record is not None:
                device = resolve_device(request.train_config.device)
                begin_record(this_round, True, device,
                             resolve_precision(request.train_config.precision, device),
                             context.world_size)
                record.set_inputs(run_inputs(this_round))
            logger.info("round %d is trained: its links of the bitext guide round %d",
                        round_number, round_number + 1)
        else:
            result.summaries = train(this_round)
            if plan.rounds > 1 and context.is_main:
                _write_state(model_dir, round_number, plan, trained=True)
        context.barrier()
        aligned = time.time()
        result.training_seconds += aligned - start
        if round_number < plan.rounds:    # the next round's guide, of its lines
            faults.reached("guide-alignment")
            # every rank aligns its share of the blocks; rank 0 writes the file
            align_bitext(model_dir, training_lines(request, plan, round_number + 1),
                         resolve_device(request.train_config.device, context.local_rank,
                                        context.local_world_size),
                         model_class(request.model_kind).METHODS[0], plan.shortlist,
                         plan.heuristic, plan.guide_threshold,
                         {plan.heuristic: guide_path(model_dir, round_number)},
                         quiet=request.quiet or not context.is_main,
                         precision=request.train_config.precision,
                         # a guide cut off goes on from its last finished block; parts of
                         # another model (the round trained again) are discarded
                         parts=guide_path(model_dir, round_number) + C.PARTS_SUFFIX,
                         resume=True, stale="discard",
                         block_lines=plan.block_lines or None,
                         description=f"guide {round_number}")
            seconds = time.time() - aligned
            result.alignment_seconds += seconds
            if record is not None:
                record.add_stage("guide", seconds)
            logger.info("self-training guide: %s of the bitext took %.1fs",
                        guide_path(model_dir, round_number), seconds)
            context.barrier()
        # the round's start is not needed once its links (or the last model) are written
        if context.is_main:
            shutil.rmtree(os.path.join(model_dir, PREVIOUS_ROUND_DIR), ignore_errors=True)
        context.barrier()
    return result


#: how :func:`train_rounds` starts a round: anew (keeping the previous round's model aside
#: first), anew from the start already kept (cut off before its training wrote anything to
#: resume), resumed from its checkpoints; or not at all (the run is finished)
FRESH, RESTART, RESUME, DONE = "fresh", "restart", "resume", "done"
#: ... or not at all, its links of the bitext written next: the last round of a finished
#: run that --resume with more --rounds goes on from
TRAINED = "trained"


def resume_point(model_dir: str, plan: SelfTraining) -> Tuple[int, str]:
    """(the round to go on with, how: FRESH / RESTART / RESUME / TRAINED / DONE) for
    ``--resume`` of a self-training run in `model_dir`.

    MODEL_DIR/selftrain.json names the round that began last and whether its training ended
    (none: round 1 has not ended; train() resumes it or says why not). Its links written, the
    next round begins (FRESH). Trained, the last round means DONE, an earlier one TRAINED (its
    links are written next: a run cut off while it aligned, or a finished one given more
    rounds). Not trained: resumed when its training wrote its config.json (the round recorded
    there), else (cut off while it prepared) trained again from the start kept aside
    (RESTART)."""
    from aligner.model_dir import config_path

    state = _read_state(model_dir)
    if state is None:
        return 1, RESUME
    round_number, trained, settings = state
    _check_same_plan(model_dir, settings, plan)
    check_condition(round_number <= plan.rounds,
                    f"{model_dir}: holds round {round_number} of a self-training run; "
                    f"--rounds {plan.rounds} ends before it")
    if round_number < plan.rounds and os.path.isfile(guide_path(model_dir, round_number)):
        return round_number + 1, FRESH
    if trained:
        return (plan.rounds + 1, DONE) if round_number == plan.rounds else (round_number,
                                                                             TRAINED)
    saved_round = None
    if os.path.isfile(config_path(model_dir)):
        saved = RunConfig.load(config_path(model_dir))
        saved_round = saved.extra.get(SELF_TRAINING_KEY, {}).get("round")
    if round_number > 1 and saved_round != round_number:
        return round_number, RESTART
    return round_number, RESUME


def _read_state(model_dir: str) -> Optional[Tuple[int, bool, Optional[Dict[str, Any]]]]:
    """(round, trained, the plan's settings or None: older files) of MODEL_DIR/selftrain.json;
    None without one."""
    path = os.path.join(model_dir, STATE_NAME)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        try:
            state = json.load(handle)
            settings = state.get("settings")
            check_condition(settings is None or isinstance(settings, dict), "")
            return int(state["round"]), bool(state.get("trained", False)), settings
        except (ValueError, KeyError, TypeError, AttributeError, AlignerError):
            raise AlignerError(f"{path}: not a self-training state (expected "
                               f'{{"round": N, "trained": true/false, "settings": {{...}}}}); '
                               f"use --overwrite to start anew") from None


def plan_settings(plan: SelfTraining) -> Dict[str, Any]:
    """What a self-training run must keep when resumed, by the option that sets it: the
    settings that decide the guides and the rounds after the first (not --rounds: a finished
    run may be given more; not the output's threshold: align extract's default)."""
    return {"--self-guide-weight": plan.guide_weight,
            "--self-guide-threshold": plan.guide_threshold,
            "-H/--symmetrize": plan.heuristic, "--fine-tune/--afresh": plan.fine_tune,
            "--fine-tune-epochs": plan.fine_tune_epochs,
            "--fine-tune-lr-schedule": plan.fine_tune_lr_schedule,
            "--shortlist": plan.shortlist, "--round-pairs": plan.round_pairs,
            "--fine-tune-share": plan.fine_tune_share}


def _check_same_plan(model_dir: str, saved: Optional[Dict[str, Any]],
                     plan: SelfTraining) -> None:
    """Refuse (one line) to resume a self-training run with other settings than its own: its
    guides would mix two runs' (a state file without settings, written by an older version,
    is not checked)."""
    if saved is None:
        return
    asked = plan_settings(plan)
    differences = [f"{option} ({saved[option]!r} saved, {value!r} asked)"
                   for option, value in asked.items()
                   if option in saved and saved[option] != value]
    check_condition(not differences,
                    f"{model_dir}: cannot resume, these self-training settings differ from the "
                    f"saved run: {', '.join(differences)} (give the saved ones: -H and "
                    f"--shortlist are align run's, so a run it started goes on with align run "
                    f"--resume; or --overwrite to start a new run)")


def _check_trained_round(request: "TrainRequest", log_to_file: bool = True) -> None:
    """What train() checks on --resume, for a trained round whose training is not resumed
    (TRAINED): the bitext is the one the cached corpus was built from, and the settings are the
    saved run's (but for its bookkeeping in ``extra``: the round, the output's defaults).
    Attaches MODEL_DIR/train.log (the round's log) to the console logging (`log_to_file`:
    rank 0's; the other ranks of a torchrun job log nothing, as in training)."""
    from aligner.log import setup_logging
    from aligner.model_dir import config_path, load_preprocessing
    from aligner.train_run import check_inputs, run_config

    model_dir = request.model_dir
    check_inputs(model_dir, request.bitext, request.ignore_data_change,
                 request.data_config.guide or None)
    saved = RunConfig.load(config_path(model_dir))
    pre, src_vocab, tgt_vocab = load_preprocessing(model_dir)
    asked = run_config(dataclasses.replace(request, init_dir=None, extra=None), pre,
                       len(src_vocab), len(tgt_vocab))
    asked.models, asked.prep = saved.models, saved.prep   # a fine-tuned round's: its start's
    differences = [key for key in saved.differences(asked) if not key.startswith("extra")]
    check_condition(not differences,
                    f"{model_dir}: cannot resume, these settings differ from the saved run: "
                    f"{', '.join(differences)} (use --overwrite to start a new run)")
    setup_logging(quiet=request.quiet, verbose=request.verbose, console=log_to_file,
                  logfile=os.path.join(model_dir, C.LOG_NAME) if log_to_file else None)


def _write_state(model_dir: str, round_number: int, plan: SelfTraining,
                 trained: bool = False) -> None:
    """MODEL_DIR/selftrain.json = {"round": N, "trained": false, "settings": the plan's},
    atomically, once round N's start is kept; "trained": true once its training has ended."""
    with atomic_output(os.path.join(model_dir, STATE_NAME)) as handle:
        json.dump({"round": round_number, "trained": trained,
                   "settings": plan_settings(plan)}, handle)
        handle.write("\n")


def _remove_earlier_rounds(model_dir: str, keep: Optional[str]) -> None:
    """Remove what an earlier run left beside its model (before an --overwrite run trains):
    its rounds' alignments and logs (selftrain.roundN.align / .log), its selftrain.json, a
    previous_round and a guide's parts folder (selftrain.roundN.align.parts) it was cut off
    with, so that no round file of another run is taken for
    this run's. `keep`: a file that stays (this run's --guide, which may be such a file).
    Each removal is logged."""
    for name in sorted(os.listdir(model_dir)):
        path = os.path.join(model_dir, name)
        if keep is not None and os.path.exists(keep) and os.path.samefile(path, keep):
            continue
        if (re.fullmatch(r"selftrain\.(round\d+\.(align|log)|json)", name)
                and os.path.isfile(path)):
            os.unlink(path)
        elif ((name == PREVIOUS_ROUND_DIR
               or re.fullmatch(r"selftrain\.round\d+\.align" + re.escape(C.PARTS_SUFFIX), name))
              and os.path.isdir(path) and not os.path.islink(path)):
            shutil.rmtree(path)
        else:
            continue
        logger.info("removed %s (an earlier run's)", path)


def _keep_round_log(model_dir: str, round_number: int) -> None:
    """MODEL_DIR/train.log -> MODEL_DIR/selftrain.round{N}.log (the next round's training
    removes train.log with the rest of the previous run; the last round's stays train.log)."""
    log = os.path.join(model_dir, C.LOG_NAME)
    if os.path.exists(log):
        os.replace(log, os.path.join(model_dir, f"selftrain.round{round_number}.log"))


def _keep_previous_round(model_dir: str) -> str:
    """Copy what the next round starts from (config, preprocessing, vocabularies, every
    direction's best weights) to MODEL_DIR/previous_round; returns that directory."""
    from aligner.model_dir import RUN_ENTRIES, checksum_path

    kept = os.path.join(model_dir, PREVIOUS_ROUND_DIR)
    shutil.rmtree(kept, ignore_errors=True)
    os.makedirs(kept)
    for name in RUN_ENTRIES:
        path = os.path.join(model_dir, name)
        if name in C.DIRECTIONS:
            os.makedirs(os.path.join(kept, name))
            shutil.copy2(os.path.join(path, C.PARAMS_BEST), os.path.join(kept, name))
            checksum = checksum_path(os.path.join(path, C.PARAMS_BEST))
            if os.path.isfile(checksum):   # verified when loaded, named in the run record
                shutil.copy2(checksum, os.path.join(kept, name))
        elif os.path.isfile(path):
            shutil.copy2(path, kept)
    return kept
