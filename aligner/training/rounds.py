"""Self-training rounds: train, align the training bitext, train again guided by those links.

What `align train --rounds N` and `align run --rounds N` do (the recipe's: recipe.ROUNDS,
aligner/training/recipe.py), above the training of one model directory
(aligner/training/run.py). Each round is a complete model directory of its own::

    MODEL_DIR/rounds/settings.json   the run's plan (SelfTraining's settings): --resume
                                     refuses other ones
    MODEL_DIR/rounds/0/links.align   the teacher's links of round 1's lines: its guide
    MODEL_DIR/rounds/0/              the teacher itself, a classical model directory
                                     (`--model classical`), whose posteriors the output mixes
                                     in (aligner/extract/mixture.py)
    MODEL_DIR/rounds/N/              round N's model directory, as `align train` writes one
      links.align                    round N's links of round N+1's lines: its guide (written
                                     through links.align.parts, block by block)
      done                           written once round N's training has ended
    MODEL_DIR/config.json, fwd/, ... the last round's model, copied up when it is done
                                     (what `align extract MODEL_DIR` reads)
    MODEL_DIR/run.json               the run record of every round (aligner/training/run_record.py)

Round 1 is the request as given, guided by the user's --guide if any, else (``teacher``) by
the links of a classical aligner trained by EM on round 1's lines and more, up to
recipe.TEACHER_PAIRS lines in all (aligner/training/teacher.py),
which rank 0 writes before round 1 trains: "round 0". After each round but the last,
the round's model aligns the lines the next round trains on (the kind's first extraction
method, both directions combined by the plan's heuristic at ``guide_threshold``; with
``guide_mix_weight`` its posteriors mixed with the teacher's, as the output's), and round
r+1 trains guided by them at ``guide_weight``, fine-tuning round r's weights (``align train
--init-from rounds/r``) for ``fine_tune_epochs`` with ``fine_tune_lr_schedule``, or from new
weights (``fine_tune`` off). config.json records the round in ``extra["self_training"]`` and,
for the last round, the output heuristic and threshold as `align extract`'s defaults
(``extra[constants.ALIGN_RUN_SETTINGS]``, with the teacher's weight in the output:
:func:`output_mix_weight`).

--resume goes on with the first round that is not done (from its checkpoints once its training
has begun), then with each guide not written (from its last finished block); a finished run
given more --rounds aligns with its last round and trains the rounds it lacks. A round never
rewrites another's directory.

Needs a kind that trains with a guide (hmm0, hmm1) and both directions. Under torchrun every
rank runs the rounds in one process group: each round trains through DDP
(aligner/training/run.py), the guide alignment between rounds is sharded over the ranks by
block (aligner/extract/corpus_alignment.py), and rank 0 alone writes the run's own files, the others
waiting for it in a barrier.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import multiprocessing
import os
import re
import shutil
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from aligner import constants as C
from aligner import faults
from aligner.config import RunConfig
from aligner.distributed import DistributedContext, distributed, resolve_device
from aligner.extract.calibrate import calibrated_extraction
from aligner.extract.corpus_alignment import Extraction, align_bitext, shortlist_options
from aligner.extract.mixture import long_line_length
from aligner.formats import write_pharaoh
from aligner.links.combine import combine, needs_soft
from aligner.log import setup_logging
from aligner.model_dir import (LOCK_NAME, PUBLISHED_ENTRIES, RUN_MARK, acquire_lock,
                               checksum_path, config_path, holds_run, load_preprocessing,
                               mark_run, prepare_output_dir, release_lock, write_version)
from aligner.models import model_class
from aligner.precision import resolve_precision
from aligner.training import teacher
from aligner.training import recipe
from aligner.training.corpus import check_inputs
from aligner.training.loop import TrainSummary
from aligner.training.joined_text import lines_as_given
from aligner.training.request import SelfTraining, TrainRequest, output_settings
from aligner.training.run_record import RunRecord, record_path
from aligner.training.run import (begin_record, check_request, request_inputs, run_config,
                                  run_inputs, supports_guide, train)
from aligner.training.samples import round_bitext, teacher_sample
from aligner.utils import AlignerError, atomic_output, check_condition, remove_stale_temporaries

logger = logging.getLogger(__name__)

#: config.json ``extra`` key of a self-training round: {"round": r}
SELF_TRAINING_KEY = "self_training"
#: what an older version's self-training run kept in MODEL_DIR (one directory rewritten per
#: round): its state file and the previous round's model kept aside (--overwrite removes them)
OLDER_STATE_NAME = "selftrain.json"
OLDER_PREVIOUS_ROUND = "previous_round"


@dataclass
class RoundsResult:
    """What :func:`train_rounds` did: the last round's training summary per direction, and
    the seconds spent training and aligning the bitext (the guides), over every round."""
    summaries: Dict[str, TrainSummary]
    training_seconds: float = 0.0
    alignment_seconds: float = 0.0


def round_dir(model_dir: str, round_number: int) -> str:
    """MODEL_DIR/rounds/N: round N's complete model directory."""
    return os.path.join(model_dir, C.ROUNDS_DIR, str(round_number))


def guide_path(model_dir: str, round_number: int) -> str:
    """MODEL_DIR/rounds/N/links.align: round N's links of round N+1's lines, its guide (N = 0:
    the teacher's)."""
    return os.path.join(round_dir(model_dir, round_number), C.ROUND_LINKS)


def done_path(model_dir: str, round_number: int) -> str:
    """MODEL_DIR/rounds/N/done: written once round N's training has ended."""
    return os.path.join(round_dir(model_dir, round_number), C.ROUND_DONE)


def _why_not_self_training(model_kind: str, directions: Sequence[str]) -> Optional[str]:
    """Why rounds after the first cannot align the bitext or train on it; None when they can."""
    if not supports_guide(model_kind) or model_class(model_kind).BASE_KIND is not None:
        return (f"self-training trains with a guide, implemented for the direct HMMs (hmm0, "
                f"hmm1), not '{model_kind}'")   # (the alignment layer: its frozen base)
    if set(directions) != set(C.DIRECTIONS):
        return ("self-training guides a round by both directions' alignments; train "
                "--directions fwd,rev")
    return None


def default_rounds(model_kind: str, directions: Sequence[str]) -> int:
    """`align train`'s default --rounds: the recipe's for a kind that trains with a guide in
    both directions; 1 otherwise (the transformer, the alignment layer, one direction)."""
    return recipe.ROUNDS if _why_not_self_training(model_kind, directions) is None else 1


def teacher_guides(request: TrainRequest, plan: SelfTraining) -> bool:
    """Whether round 1 of `plan` is guided by the teacher's links: rounds follow it, and the
    user gave no --guide."""
    return plan.teacher and plan.rounds > 1 and not request.data_config.guide


def check_rounds(model_kind: str, directions: Sequence[str], rounds: int) -> None:
    """Refuse (one line) rounds > 1 where a round cannot align the bitext or train on it."""
    if rounds > 1:
        reason = _why_not_self_training(model_kind, directions)
        check_condition(reason is None, f"--rounds {rounds}: {reason}")


def output_mix_weight(request: TrainRequest, plan: SelfTraining) -> Optional[float]:
    """The weight of the teacher's posteriors in the output (recipe.MIX_WEIGHT; recorded as
    `align extract`'s default with its long-line length, the recipe.MIX_LENGTH_QUANTILE of
    the lengths of the bitext's lines as the rounds train on them, joined with --join-lines;
    aligner/extract/mixture.py) where the run keeps its teacher
    (rounds/0, :func:`write_teacher_links`) and the output reads posteriors; else None. Not
    with --tokenize: the teacher's words are the lines' own, the model's the tokenizer's."""
    if (teacher_guides(request, plan) and needs_soft(plan.heuristic)
            and not request.prep_config.tokenize):
        return recipe.MIX_WEIGHT
    return None


def output_mix_length(request: TrainRequest) -> int:
    """The long-line length of the teacher's mixture (aligner/extract/mixture.py): the
    recipe.MIX_LENGTH_QUANTILE of the lengths of the bitext's lines as the rounds train on
    them (with --join-lines: its runs), for the output and the guides alike."""
    return long_line_length(request.bitext, recipe.MIX_LENGTH_QUANTILE)


def round_request(request: TrainRequest, plan: SelfTraining, round_number: int
                  ) -> TrainRequest:
    """The training request of round `round_number` (1-based) of `plan` on `request` (round
    1's; its resume flag is left to the caller)."""
    extra = dict(request.extra or {})
    bitext = training_lines(request, plan, round_number)
    model_dir = request.model_dir
    if plan.rounds > 1:
        extra[SELF_TRAINING_KEY] = {"round": round_number}
        extra.pop(C.ALIGN_RUN_SETTINGS, None)
        if round_number == plan.rounds:   # the output's defaults, for align extract
            mix_weight = output_mix_weight(request, plan)
            mix_length = None if mix_weight is None else output_mix_length(request)
            extra[C.ALIGN_RUN_SETTINGS] = output_settings(
                plan.heuristic, plan.output_threshold, mix_weight, mix_length)
        request = dataclasses.replace(request, model_dir=round_dir(model_dir, round_number))
    if round_number == 1:
        if not teacher_guides(request, plan):
            return dataclasses.replace(request, bitext=bitext, extra=extra or None)
        return dataclasses.replace(
            request, bitext=bitext, extra=extra or None,
            train_config=dataclasses.replace(request.train_config,
                                             guide_weight=recipe.TEACHER_GUIDE_WEIGHT),
            data_config=dataclasses.replace(request.data_config,
                                            guide=guide_path(model_dir, 0)))
    config = dataclasses.replace(request.train_config, guide_weight=plan.guide_weight)
    parallel_directions = request.parallel_directions
    if round_number == plan.rounds and plan.final_agreement_weight > 0:
        config = dataclasses.replace(config, agreement_weight=plan.final_agreement_weight)
        parallel_directions = False     # agreement trains both directions in one loop
    init_dir = None
    if plan.fine_tune:
        init_dir = round_dir(model_dir, round_number - 1)
        config = dataclasses.replace(config, lr_schedule=plan.fine_tune_lr_schedule)
        if not config.max_updates:
            config = dataclasses.replace(config, max_epochs=plan.fine_tune_epochs)
    return dataclasses.replace(
        request, bitext=bitext, train_config=config, extra=extra, init_dir=init_dir,
        parallel_directions=parallel_directions,
        data_config=dataclasses.replace(request.data_config,
                                        guide=guide_path(model_dir, round_number - 1)))


def training_lines(request: TrainRequest, plan: SelfTraining, round_number: int):
    """The bitext round `round_number` of `plan` trains on (and the round before it aligns to
    guide it): ``request.bitext``, or its sample of ``plan.round_pairs`` lines for that round
    (aligner/training/samples.py) — not for one plain training, nor for a round 1 trained with
    the user's --guide (its lines are the whole bitext's)."""
    if plan.rounds == 1 or (round_number == 1 and request.data_config.guide):
        return request.bitext
    return round_bitext(request.bitext, plan.round_pairs, request.train_config.seed,
                        round_number, plan.fine_tune_share)


def train_rounds(request: TrainRequest, plan: SelfTraining) -> RoundsResult:
    """Train `plan.rounds` rounds into ``request.model_dir`` (see the module docstring);
    ``request`` is round 1's, naming the run's directory. With ``request.resume`` the run goes
    on with its first round that is not done. Under torchrun every rank calls this. Returns
    the last round's summaries and the time spent."""
    check_rounds(request.model_kind, request.directions, plan.rounds)
    check_condition(plan.final_agreement_weight == 0 or plan.rounds > 1,
                    "--final-agreement-weight trains the last of two or more self-training "
                    "rounds: give --rounds 2 or more")
    if plan.rounds == 1:   # one ordinary run in the directory itself
        start = time.time()
        summaries = train(request)
        return RoundsResult(summaries=summaries, training_seconds=time.time() - start)
    # one process group for every round: each round's training and guide alignment use it
    with distributed(request.train_config.device) as context:
        return _train_rounds_in_group(request, plan, context)


def _train_rounds_in_group(request: TrainRequest, plan: SelfTraining,
                           context: DistributedContext) -> RoundsResult:
    """:func:`train_rounds` inside the process group `context` (one process: a 1-rank
    context). Rank 0 alone writes the run's own files (settings, done marks, the published
    model); every rank trains and aligns its share of the guides."""
    model_dir = request.model_dir
    result = RoundsResult(summaries={})
    lock = record = None
    try:
        device = resolve_device(request.train_config.device, context.local_rank,
                                context.local_world_size)
        if context.is_main:   # the run record's session: this command, every round
            lock, resumed = _open_run(request, plan)
            record = begin_record(
                dataclasses.replace(request, record=RunRecord.resumed(model_dir) if resumed
                                    else RunRecord(record_path(model_dir))),
                resumed, device, resolve_precision(request.train_config.precision, device),
                context.world_size)
        context.barrier()
        first_undone = next((r for r in range(1, plan.rounds + 1)
                             if not os.path.isfile(done_path(model_dir, r))), None)
        for round_number in range(1, plan.rounds + 1):
            this_round = round_request(request, plan, round_number)
            start = time.time()
            if record is not None:
                record.current_round = round_number
            if this_round.bitext is not request.bitext:
                logger.info("round %d trains on %s", round_number,
                            this_round.bitext.description)
            if (round_number == 1 and teacher_guides(request, plan)
                    and not os.path.isfile(done_path(model_dir, 1))
                    and not os.path.isfile(guide_path(model_dir, 0))):
                result.alignment_seconds += _teacher_guide(request, plan, record, context)
            if os.path.isfile(done_path(model_dir, round_number)):
                # the run goes on from here (or, every round done, its model aligns): the
                # same data and settings
                if round_number + 1 == first_undone:
                    _check_trained_round(this_round, context.is_main)
                    if record is not None:
                        record.set_inputs(run_inputs(this_round))
                    logger.info("round %d is trained: its links guide round %d",
                                round_number, round_number + 1)
                elif first_undone is None and round_number == plan.rounds:
                    _check_round_inputs(this_round)   # its log stays as it is
            else:
                result.summaries = _train_round(model_dir, this_round, plan, round_number,
                                                record, context)
                result.training_seconds += time.time() - start
            if round_number < plan.rounds and not os.path.isfile(
                    guide_path(model_dir, round_number)):
                result.alignment_seconds += _align_guide(request, plan, round_number, device,
                                                         record, context)
        if first_undone is None:
            logger.info("%s: the run's last round is trained: nothing to resume", model_dir)
        if context.is_main:
            _publish(round_dir(model_dir, plan.rounds), model_dir)
            if needs_soft(plan.heuristic):
                result.alignment_seconds += _calibrate(request, plan, device, record)
        context.barrier()
    finally:
        if lock is not None:
            release_lock(lock)
    return result


def _open_run(request: TrainRequest, plan: SelfTraining):
    """Rank 0: take the run's directory (its lock, then as train() takes a model directory:
    a new or empty one, an earlier run of ours with --overwrite, or the run itself with
    --resume) and write or check the plan's settings. Returns (the lock, resumed)."""
    model_dir = request.model_dir
    check_condition(not os.path.exists(model_dir) or os.path.isdir(model_dir),
                    f"{model_dir}: exists and is not a directory")
    os.makedirs(model_dir, exist_ok=True)
    lock = acquire_lock(model_dir)
    try:
        settings = os.path.join(model_dir, C.ROUNDS_DIR, C.ROUND_SETTINGS)
        if request.resume:
            _refuse_older_layout(model_dir)
        resumed = request.resume and os.path.isfile(settings)
        if request.resume and not resumed:   # only a run cut off before its settings
            leftovers = set(os.listdir(model_dir)) - {LOCK_NAME, RUN_MARK, C.VERSION_NAME}
            check_condition(holds_run(model_dir) and not leftovers,
                            f"{model_dir}: nothing to resume (no self-training run: "
                            f"{C.ROUNDS_DIR}/{C.ROUND_SETTINGS} is missing)")
        if resumed:
            planned, saved = _read_settings(settings)
            _check_same_plan(model_dir, saved, plan)
            remove_stale_temporaries(model_dir)   # of a run killed while it published
            rounds = [int(name) for name in os.listdir(os.path.dirname(settings))
                      if name.isdigit()]
            check_condition(max(rounds, default=0) <= plan.rounds,
                            f"{model_dir}: holds round {max(rounds, default=0)} of a "
                            f"self-training run; --rounds {plan.rounds} ends before it")
            planned = plan.rounds if planned is None else planned
            check_condition(plan.final_agreement_weight == 0 or plan.rounds == planned,
                            f"{model_dir}: its last round ({planned}) trains with "
                            f"--final-agreement-weight: no round can follow it (--rounds "
                            f"{planned}, or --overwrite for a new run)")
            return lock, True
        # a new run: everything checked before anything is removed
        check_request(round_request(request, plan, 1))
        # (--resume of a run cut off before its settings were written: it starts again)
        overwrite = request.overwrite or request.resume
        prepare_output_dir(model_dir, False, overwrite, request_inputs(request))
        if overwrite:
            _remove_older_rounds(model_dir, keep=request.data_config.guide or None)
        mark_run(model_dir)
        write_version(model_dir)
        os.makedirs(os.path.dirname(settings), exist_ok=True)
        with atomic_output(settings) as handle:
            json.dump({"rounds": plan.rounds, "settings": plan_settings(plan)}, handle)
            handle.write("\n")
        return lock, False
    except BaseException:
        release_lock(lock)
        raise


def _train_round(model_dir: str, this_round: TrainRequest, plan: SelfTraining,
                 round_number: int, record, context) -> Dict[str, TrainSummary]:
    """Train round `round_number` into its directory (``this_round.model_dir``): resumed from
    its checkpoints when its training had begun (its config.json is written), else from the
    start (anything a start cut off left there is removed: the folder is the run's own);
    then its done mark."""
    folder = this_round.model_dir
    resume = os.path.isfile(config_path(folder))
    if round_number > 1:
        logger.info("self-training round %d of %d, guided by %s%s%s", round_number,
                    plan.rounds, this_round.data_config.guide,
                    ", from its model's weights" if plan.fine_tune else "",
                    " (resumed)" if resume else "")
        if not resume:
            faults.reached("round-start")
    if not resume and context.is_main and os.path.lexists(folder):
        check_condition(os.path.isdir(folder) and not os.path.islink(folder),
                        f"{folder}: not a round's directory (a file or a link): nothing was "
                        f"removed")
        shutil.rmtree(folder)   # what a start cut off left in the run's own folder
    context.barrier()
    summaries = train(dataclasses.replace(this_round, resume=resume, overwrite=False,
                                          record=record))
    if context.is_main:
        with atomic_output(done_path(model_dir, round_number)) as handle:
            handle.write(f"round {round_number} of {plan.rounds} trained\n")
    context.barrier()
    return summaries


def _teacher_guide(request: TrainRequest, plan: SelfTraining, record, context) -> float:
    """Rank 0: the classical teacher (aligner/training/teacher.py) trains on round 1's lines and
    more, up to recipe.TEACHER_PAIRS lines in all (aligner/training/samples.py
    teacher_sample), and writes its links of round 1's lines, soft-average at
    recipe.TEACHER_THRESHOLD, to MODEL_DIR/rounds/0/links.align (atomically: a teacher cut off
    starts again); the other ranks wait for it. It runs in a "spawn" process of its own, so
    that its memory (at its peak 1.5 GiB on the 407k job's 60,000 lines: teacher_memory.md) goes
    back to the system when it ends instead of staying in this process's heap
    (aligner/malloc.py), with aligner.training.teacher.THREADS torch threads. Returns the
    seconds."""
    start = time.time()
    faults.reached("teacher")
    path = guide_path(request.model_dir, 0)
    if context.is_main:
        source, target, round_lines = teacher_lines(request.bitext, plan.round_pairs,
                                                    request.train_config.seed)
        logger.info("teacher: IBM-1 and HMM alignment (EM) of %d lines, round 1's %d among "
                    "them", len(source), len(source) if round_lines is None else len(round_lines))
        write_teacher_links_apart(source, target, path, round_lines)
    seconds = time.time() - start
    if record is not None:
        record.add_stage("teacher", seconds)
    logger.info("teacher: %s (round 1's guide) took %.1fs", path, seconds)
    context.barrier()
    return seconds


def teacher_lines(bitext, round_pairs: int, seed: int,
                  teacher_pairs: int = recipe.TEACHER_PAIRS
                  ) -> Tuple[List[List[str]], List[List[str]], Optional[Sequence[int]]]:
    """The lines the teacher trains on (aligner/training/samples.py teacher_sample: up to
    `teacher_pairs`, holding round 1's `round_pairs` drawn with `seed`) as source and target
    word lists, and the 0-based positions of round 1's lines among them (None: all)."""
    lines, round_lines = teacher_sample(bitext, round_pairs, teacher_pairs, seed)
    source, target = [], []
    for source_words, target_words in lines:
        source.append(source_words)
        target.append(target_words)
    return source, target, round_lines


def write_teacher_links_apart(source: Sequence[Sequence[str]], target: Sequence[Sequence[str]],
                              path: str, guide_lines: Optional[Sequence[int]] = None) -> None:
    """:func:`write_teacher_links` with aligner.training.teacher.THREADS torch threads, in a
    "spawn" process of its own (its memory goes back to the system when it ends)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.apply(write_teacher_links, (source, target, path, teacher.THREADS, guide_lines))


def write_teacher_links(source: Sequence[Sequence[str]], target: Sequence[Sequence[str]],
                        path: str, threads: int, guide_lines: Optional[Sequence[int]] = None
                        ) -> None:
    """Train the teacher on the lines (source words, target words) with `threads` torch
    threads, write it as a classical model directory into the folder of `path` (round 0's:
    the output's mixture, aligner/extract/mixture.py) and its soft-average links at
    recipe.TEACHER_THRESHOLD of the lines `guide_lines` (0-based positions among them, sorted;
    None: all) to `path`, one Pharaoh line per line, last (the body of
    :func:`_teacher_guide`'s process)."""
    torch.set_num_threads(threads)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    remove_stale_temporaries(folder)   # of a teacher killed as it wrote
    links = combine(C.SOFT_HEURISTICS[0], recipe.TEACHER_THRESHOLD,
                    soft=teacher.soft_alignments(source, target, model_dir=folder,
                                                 lines=guide_lines))
    write_pharaoh(path, links)


def _calibrate(request: TrainRequest, plan: SelfTraining, device, record) -> float:
    """Rank 0: the output's thresholds per line length, calibrated with the published model
    on the bitext's lines as given (not joined; aligner/extract/calibrate.py) with the
    extraction `align run` and `align extract` use by default, into MODEL_DIR/calibration.json
    (kept when it is this model's already). Returns the seconds it took."""
    start = time.time()
    extraction = Extraction.load(request.model_dir, device,
                                 model_class(request.model_kind).METHODS[0], plan.heuristic,
                                 plan.output_threshold, shortlist_options(recipe.SHORTLIST),
                                 pooling=recipe.SUBWORD_POOLING)
    calibrated_extraction(extraction, lines_as_given(request.bitext), request.train_config.seed,
                          resolve_precision(request.train_config.precision, device,
                                            inference=True), write=True)
    seconds = time.time() - start
    if record is not None:
        record.add_stage("calibration", seconds)
    return seconds


def _align_guide(request: TrainRequest, plan: SelfTraining, round_number: int, device,
                 record, context) -> float:
    """Round `round_number`'s model aligns round `round_number` + 1's lines into its
    links.align (every rank its share of the blocks, rank 0 writes; a guide cut off goes on
    from its last finished block). Returns the seconds it took."""
    aligning = time.time()
    faults.reached("guide-alignment")
    path = guide_path(request.model_dir, round_number)
    mixing = plan.guide_mix_weight > 0 and output_mix_weight(request, plan) is not None
    mixture = dict(mix_dir=round_dir(request.model_dir, 0),
                   mix_weight=plan.guide_mix_weight,
                   mix_length=output_mix_length(request),
                   mix_threshold=recipe.TEACHER_MIX_THRESHOLD) if mixing else {}
    align_bitext(Extraction.load(round_dir(request.model_dir, round_number), device,
                                 model_class(request.model_kind).METHODS[0], plan.heuristic,
                                 plan.guide_threshold, shortlist_options(plan.shortlist),
                                 pooling=recipe.GUIDE_SUBWORD_POOLING, **mixture),
                 training_lines(request, plan, round_number + 1), {plan.heuristic: path},
                 quiet=request.quiet or not context.is_main,
                 precision=request.train_config.precision, parts=path + C.PARTS_SUFFIX,
                 resume=True, stale="discard", block_lines=plan.block_lines or None,
                 description=f"guide {round_number}",
                 # (a round from new weights learns its own BPE: its skipped lines may differ)
                 trained_by=request.data_config if plan.fine_tune else None)
    seconds = time.time() - aligning
    if record is not None:
        record.add_stage("guide", seconds)
    logger.info("self-training guide: %s of the bitext took %.1fs", path, seconds)
    context.barrier()
    return seconds


def _publish(source_dir: str, model_dir: str) -> None:
    """Copy the last round's model (MODEL_DIR/rounds/N: what `align extract` reads) to the top
    of MODEL_DIR, the weights first and config.json last, so that a copy cut off is never a
    loadable model; done again when a run is resumed."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(config_path(model_dir))
    for name in PUBLISHED_ENTRIES:   # config.json is the last entry
        path = os.path.join(source_dir, name)
        if name in C.DIRECTIONS:
            os.makedirs(os.path.join(model_dir, name), exist_ok=True)
            for file in (C.PARAMS_BEST, checksum_path(C.PARAMS_BEST)):
                if os.path.isfile(os.path.join(path, file)):
                    _copy(os.path.join(path, file), os.path.join(model_dir, name, file))
        # (config.json is copied unconditionally: a done round always has one)
        elif name == C.CONFIG_NAME or os.path.isfile(path):
            _copy(path, os.path.join(model_dir, name))


def _copy(source: str, destination: str) -> None:
    """Copy a file atomically (a temporary beside `destination`, then renamed)."""
    with open(source, "rb") as handle, atomic_output(destination, "wb") as out:
        shutil.copyfileobj(handle, out)


def _refuse_older_layout(model_dir: str) -> None:
    """A self-training run of an older version (one directory rewritten per round,
    MODEL_DIR/selftrain.json) cannot be resumed or gone on with: one line."""
    check_condition(not os.path.isfile(os.path.join(model_dir, OLDER_STATE_NAME)),
                    f"{model_dir}: a self-training run of an older version (its "
                    f"{OLDER_STATE_NAME}; rounds are now MODEL_DIR/{C.ROUNDS_DIR}/N): it "
                    f"cannot be gone on with; start a new run (--overwrite)")


def plan_settings(plan: SelfTraining) -> Dict[str, Any]:
    """What a self-training run must keep when resumed, by the option that sets it: the
    settings that decide the guides and the rounds after the first (not --rounds: a finished
    run may be given more), and the output's threshold, recorded in the last round's
    config.json as align extract's default (resumed with another, align run's output and
    align extract's would differ)."""
    return {"--self-guide-weight": plan.guide_weight,
            "--self-guide-threshold": plan.guide_threshold,
            "--self-guide-mix-weight": plan.guide_mix_weight,
            "-H/--symmetrize": plan.heuristic, "--fine-tune/--afresh": plan.fine_tune,
            "--fine-tune-epochs": plan.fine_tune_epochs,
            "--fine-tune-lr-schedule": plan.fine_tune_lr_schedule,
            "--shortlist": plan.shortlist, "--round-pairs": plan.round_pairs,
            "--fine-tune-share": plan.fine_tune_share,
            "--final-agreement-weight": plan.final_agreement_weight,
            "--teacher/--no-teacher": plan.teacher,
            "--threshold": plan.output_threshold}


def _check_same_plan(model_dir: str, saved: Optional[Dict[str, Any]],
                     plan: SelfTraining) -> None:
    """Refuse (one line) to resume a self-training run with other settings than its own: its
    guides would mix two runs' (a state file without settings, written by an older version,
    is not checked)."""
    if saved is None:
        return
    # runs from before the options: no agreement in the last round, round 1 unguided
    # (and the guides of the network alone)
    saved = {"--final-agreement-weight": 0.0, "--teacher/--no-teacher": False,
             "--self-guide-mix-weight": 0.0, **saved}
    asked = plan_settings(plan)
    differences = [f"{option} ({saved[option]!r} saved, {value!r} asked)"
                   for option, value in asked.items()
                   if option in saved and saved[option] != value]
    check_condition(not differences,
                    f"{model_dir}: cannot resume, these self-training settings differ from the "
                    f"saved run: {', '.join(differences)} (give the saved ones: -H and "
                    f"--shortlist are align run's, so a run it started goes on with align run "
                    f"--resume; or --overwrite to start a new run)")


def _check_trained_round(request: TrainRequest, log_to_file: bool = True) -> None:
    """What train() checks on --resume, for the last done round when the run goes on after
    it (its training is not resumed): the bitext is the one the cached corpus was built from, and
    the settings are the
    saved run's (but for its bookkeeping in ``extra``: the round, the output's defaults).
    Attaches MODEL_DIR/train.log (the round's log) to the console logging (`log_to_file`:
    rank 0's; the other ranks of a torchrun job log nothing, as in training)."""
    _check_round_inputs(request)
    setup_logging(quiet=request.quiet, verbose=request.verbose, console=log_to_file,
                  logfile=os.path.join(request.model_dir, C.LOG_NAME) if log_to_file
                  else None)


def _check_round_inputs(request: TrainRequest) -> None:
    """The checks of :func:`_check_trained_round`: the bitext and the settings are the done
    round's (one line, naming what differs)."""
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


def _read_settings(path: str) -> Tuple[Optional[int], Dict[str, Any]]:
    """The plan saved in MODEL_DIR/rounds/settings.json: its rounds (None: not recorded) and
    its settings (:func:`plan_settings`)."""
    with open(path, encoding="utf-8") as handle:
        try:
            saved = json.load(handle)
            settings = saved["settings"]
            check_condition(isinstance(settings, dict), "")
            return saved.get("rounds"), settings
        except (ValueError, KeyError, TypeError, AlignerError):
            raise AlignerError(f"{path}: not the settings of a self-training run (expected "
                               f'{{"rounds": N, "settings": {{...}}}}); use --overwrite to '
                               f"start anew") from None


def _remove_older_rounds(model_dir: str, keep: Optional[str]) -> None:
    """Remove the round files that an older version's self-training run left beside its
    model (before an --overwrite run trains): its rounds' alignments and logs
    (selftrain.roundN.align / .log), its selftrain.json, a previous_round and a guide's parts
    folder (selftrain.roundN.align.parts). `keep`: a file that stays (this run's --guide,
    which may be such a file). Each removal is logged."""
    for name in sorted(os.listdir(model_dir)):
        path = os.path.join(model_dir, name)
        if keep is not None and os.path.exists(keep) and os.path.samefile(path, keep):
            continue
        if (re.fullmatch(r"selftrain\.(round\d+\.(align|log)|json)", name)
                and os.path.isfile(path)):
            os.unlink(path)
        elif ((name == OLDER_PREVIOUS_ROUND
               or re.fullmatch(r"selftrain\.round\d+\.align" + re.escape(C.PARTS_SUFFIX), name))
              and os.path.isdir(path) and not os.path.islink(path)):
            shutil.rmtree(path)
        else:
            continue
        logger.info("removed %s (an earlier run's)", path)
