"""The stages of a kind trained on a frozen base (the alignment layer), above the rounds: stage
0, the recipe's links of the bitext as the guided layer's guide; stage 1, its base; stage 2,
the layer on the frozen base (:func:`train_layer`).

Stage 0 runs for the guided alignment layer trained without --guide:

Zenkel et al. (2020) train the alignment layer's attention on another aligner's links of the
training text. `align train --model alignment-layer` with no --guide (and without
``--layer-query prefix``, the unguided layer of 2019) takes the recipe's: it trains the recipe
(aligner/training/recipe.py: what `align run` trains with no flags) on the same bitext, aligns
every line with it (its output as `align run` writes it: hmm-posterior mixed with its
teacher's since 2026-11-30, -H soft-average at the recipe's output threshold), and the layer
(stage 2, after its base) trains guided by those links::

    MODEL_DIR/guide/              the recipe's self-training run (aligner/training/rounds.py)
      links.align                 its alignments of the bitext, one line per line: the guide
                                  (written once complete, through links.align.parts)

--resume goes on where the stage stopped: in a round of the recipe, in its alignment of the
bitext (from its last finished block), or, with links.align written, with the stages after it;
the recipe's run refuses another bitext or other settings, as `align run --resume` does.
--overwrite trains every stage again: the replaced run's links.align and its parts, and the
files of its base and layer, are removed before stage 0 (each folder a run of ours), so that
--resume after a cut-off never takes them for the new run's.

Stage 1 is an ordinary run of the kind's ``BASE_KIND`` into MODEL_DIR/base (skipped when
``align train --base`` names a trained model directory of that kind); stage 2 reuses the
base's preprocessing and vocabularies, copies the base's weights into the new model and trains
what is not frozen (:func:`aligner.training.run.train` with the base as ``base_dir``). Model
size comes from the base; of the model options only the kind's own (``split_options``) apply
in stage 2, with the kind's own training settings (``TrainRequest.layer_training``).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from typing import Dict, Tuple

from aligner import constants as C
from aligner.config import RunConfig
from aligner.distributed import DistributedContext, distributed, resolve_device
from aligner.extract.calibrate import calibrated_extraction
from aligner.extract.corpus_alignment import Extraction, align_bitext, shortlist_options
from aligner.links.combine import needs_soft
from aligner.model_dir import (BASE_DIR, GUIDE_DIR, check_new_run, config_path, holds_run,
                               load_preprocessing, remove_run_files, run_entries)
from aligner.models import model_class
from aligner.training import recipe
from aligner.training.builder import build_job
from aligner.training.loop import TrainSummary
from aligner.training.request import SelfTraining, TrainRequest
from aligner.training.rounds import train_rounds
from aligner.training.run import check_request, request_inputs, train
from aligner.utils import check_condition

logger = logging.getLogger(__name__)

#: MODEL_DIR/guide/links.align: the recipe's links of the bitext
LINKS_NAME = "links.align"


def guide_dir(model_dir: str) -> str:
    """MODEL_DIR/guide: the recipe's run that guides the layer."""
    return os.path.join(model_dir, GUIDE_DIR)


def links_path(model_dir: str) -> str:
    """MODEL_DIR/guide/links.align (absolute): the layer's guide."""
    return os.path.abspath(os.path.join(guide_dir(model_dir), LINKS_NAME))


def recipe_job(request: TrainRequest, resume: bool = False
               ) -> Tuple[TrainRequest, SelfTraining]:
    """The recipe's job (as `align run` with no flags: :func:`build_job` with no setting
    given) on ``request.bitext`` into MODEL_DIR/guide, both directions, on the request's
    device, precision and seed, with its tokenization and lowercasing (so that the links
    index the words the layer trains on); `resume`: the run in MODEL_DIR/guide goes on (its
    batches then its own, as for `align run --resume`). Returns (round 1's request, the
    plan)."""
    given = request.train_config
    prep = request.prep_config
    if request.base_dir is not None:   # the words as the layer sees them: its base's
        prep = load_preprocessing(request.base_dir)[0].config
    return build_job(guide_dir(request.model_dir), request.bitext,
                     prep_options=dict(tokenize=prep.tokenize, src_lang=prep.src_lang,
                                       tgt_lang=prep.tgt_lang, lowercase=prep.lowercase),
                     device=given.device, precision=given.precision,
                     deterministic=given.deterministic, seed=given.seed, resume=resume,
                     overwrite=request.overwrite, quiet=request.quiet, record_output=True,
                     verbose=request.verbose, argv=request.argv,
                     ignore_data_change=request.ignore_data_change)


def check_stages(request: TrainRequest) -> None:
    """Rank 0, before stage 0: refuse (one line, nothing written) what a later stage would
    refuse only after hours of the recipe. A new run: the model directory and the stages'
    own (MODEL_DIR/guide, MODEL_DIR/base) must be new, empty, or runs of ours given
    --overwrite. --resume: some stage must hold a run, and a layer run already begun (its
    config.json) must be one trained on the recipe's links."""
    model_dir = request.model_dir
    check_condition(request.base_dir is None or os.path.isfile(config_path(request.base_dir)),
                    f"{request.base_dir}: not a model directory ({C.CONFIG_NAME} is missing)")
    stages = [guide_dir(model_dir)] + ([os.path.join(model_dir, BASE_DIR)]
                                       if request.base_dir is None else [])
    if not request.resume:
        for folder in [model_dir] + stages:
            check_new_run(folder, request.overwrite, request_inputs(request))
        return
    if not run_entries(model_dir):   # the layer (stage 2) has not begun
        check_condition(any(os.path.isdir(folder) and holds_run(folder) for folder in stages),
                        f"{model_dir}: nothing to resume (the directory is empty or missing)")
        return
    if not os.path.isfile(config_path(model_dir)):   # stage 2 cut off before it trained
        check_condition(holds_run(model_dir),
                        f"{model_dir}: cannot resume, {C.CONFIG_NAME} is missing")
        return
    # (by its place in the directory, which may have moved: stage 2 compares the content)
    saved = RunConfig.load(config_path(model_dir)).data.guide
    check_condition(bool(saved) and os.path.normpath(saved).endswith(
                        os.sep + os.path.join(GUIDE_DIR, LINKS_NAME)),
                    f"{model_dir}: cannot resume, its layer trains on "
                    f"{saved or 'no guide'}, not on the recipe's links of the bitext "
                    f"({links_path(model_dir)}): give the flags of its run, or --overwrite")


def train_guide(request: TrainRequest, context: DistributedContext) -> TrainRequest:
    """Stage 0: train the recipe into MODEL_DIR/guide (with --resume: go on with it; a
    finished one is checked against the bitext and settings) and write its links of the
    bitext to MODEL_DIR/guide/links.align unless they are written (see the module
    docstring). Under torchrun every rank calls this (the rounds and the alignment are
    sharded, rank 0 writes). Returns the request of the stages after it: guided by those
    links."""
    links = links_path(request.model_dir)
    folder = guide_dir(request.model_dir)
    resume = request.resume and os.path.isdir(folder) and holds_run(folder)
    job, plan = recipe_job(request, resume)
    if context.is_main and request.overwrite and os.path.isdir(folder) and holds_run(folder):
        # the guide of the run being replaced, first: a run cut off before its own links
        # are written must never find these
        parts = links + C.PARTS_SUFFIX
        for path in (links, parts):
            check_condition(not os.path.islink(path),
                            f"{path}: a symbolic link, which align never writes: --overwrite "
                            f"would remove what it points to (nothing was removed; remove the "
                            f"link yourself)")
        if os.path.isfile(links):
            os.unlink(links)
        if os.path.isdir(parts):
            shutil.rmtree(parts)
    if context.is_main and request.overwrite:
        # likewise the later stages' files (check_stages found them ours): --resume after a
        # cut-off never takes the replaced run's base or layer for this run's
        for stage in [request.model_dir] + ([os.path.join(request.model_dir, BASE_DIR)]
                                            if request.base_dir is None else []):
            if os.path.isdir(stage) and holds_run(stage):
                remove_run_files(stage)
    context.barrier()
    logger.info("stage 0: the recipe (%s, %d rounds) in %s: its links of the bitext guide "
                "the layer", recipe.MODEL_KIND, plan.rounds, folder)
    train_rounds(job, plan)
    if not os.path.isfile(links):
        device = resolve_device(request.train_config.device, context.local_rank,
                                context.local_world_size)
        # the recipe's output, as align run writes it: its posteriors mixed with its
        # teacher's (aligner/extract/mixture.py), calibrated per line length
        extraction = Extraction.load(folder, device, recipe.METHOD, plan.heuristic,
                                     plan.output_threshold, shortlist_options(plan.shortlist),
                                     pooling=recipe.SUBWORD_POOLING)
        if needs_soft(plan.heuristic):   # calibrated per line length on the bitext
            extraction = calibrated_extraction(
                extraction, request.bitext, request.train_config.seed,
                request.train_config.precision, write=context.is_main)
        align_bitext(extraction, request.bitext, {plan.heuristic: links},
                     quiet=request.quiet or not context.is_main,
                     precision=request.train_config.precision, parts=links + C.PARTS_SUFFIX,
                     resume=True, description="guide",
                     anew=f"remove {links + C.PARTS_SUFFIX} to align anew")
    context.barrier()
    return dataclasses.replace(request, recipe_guide=False,
                               data_config=dataclasses.replace(request.data_config, guide=links))


def train_layer(request: TrainRequest) -> Dict[str, TrainSummary]:
    """`align train` of a kind trained on a frozen base (``BASE_KIND``: the alignment layer):
    stage 0 with ``request.recipe_guide`` (:func:`train_guide`), stage 1 (:func:`base_stage`),
    then stage 2 (:func:`aligner.training.run.train` on the trained base), all in one process
    group (under torchrun every rank calls this). Returns stage 2's training summary per
    direction."""
    check_request(request)
    check_condition(model_class(request.model_kind).BASE_KIND is not None,
                    f"'{request.model_kind}' is not trained on a frozen base: it trains in "
                    f"one model directory (aligner.training.run.train)")
    with distributed(request.train_config.device) as context:
        if request.recipe_guide:
            if context.is_main:   # refused now, not after hours of stage 0
                check_stages(request)
            context.barrier()
            request = train_guide(request, context)
        return train(base_stage(request, context))


def base_stage(request: TrainRequest, context: DistributedContext) -> TrainRequest:
    """Stage 1: train the base into MODEL_DIR/base (unless `base_dir` is given), check it.
    Returns the request of stage 2: the kind's own model options, its own training settings
    (``layer_training`` over `train_config`), the base directory (also recorded in
    config.json's ``extra``), and resume only when stage 2 had started (a start of it cut
    off, its config.json not written, starts again). `context`: the run's process group
    (every rank calls this)."""
    model_kind, train_config = request.model_kind, request.train_config
    cls = model_class(model_kind)
    base_kind = cls.BASE_KIND
    base_options, own_options = cls.split_options(request.model_options)
    base_dir, resume, overwrite = request.base_dir, request.resume, request.overwrite
    if base_dir is None:
        base_dir = os.path.join(request.model_dir, BASE_DIR)
        base_methods = model_class(base_kind).METHODS
        # the base trains without the guide: the guide is the layer's (stage 2)
        stage1 = dataclasses.replace(train_config, guide_weight=0.0)
        if train_config.valid_method and train_config.valid_method not in base_methods:
            stage1 = dataclasses.replace(stage1, valid_method="")
        logger.info("stage 1: training the %s base into %s", base_kind, base_dir)
        # resumed where its training had begun (config.json written; a run cut off in stage
        # 0 has no base yet), started again where a start was cut off: every rank decides
        # before rank 0 can write there
        resume_base = resume and os.path.isfile(config_path(base_dir))
        restart_base = resume and not resume_base and os.path.isdir(base_dir) and holds_run(
            base_dir)
        context.barrier()
        train(dataclasses.replace(request, model_dir=base_dir, model_kind=base_kind,
                                  resume=resume_base,
                                  overwrite=request.overwrite or restart_base,
                                  model_options=base_options, train_config=stage1, extra=None,
                                  data_config=dataclasses.replace(request.data_config, guide=""),
                                  base_dir=None, record=None))
        # stage 2 resumes only when it had started (it writes config.json first); a start of
        # it cut off starts again
        started = os.path.isfile(config_path(request.model_dir))
        overwrite = overwrite or (resume and not started and holds_run(request.model_dir)
                                  and bool(run_entries(request.model_dir)))
        resume = resume and started
    check_condition(os.path.isfile(config_path(base_dir)),
                    f"{base_dir}: not a model directory ({C.CONFIG_NAME} is missing)")
    base_config = RunConfig.load(config_path(base_dir))
    check_condition(base_config.model_kind == base_kind,
                    f"{base_dir}: the base of '{model_kind}' must be a '{base_kind}' model "
                    f"directory, this one holds '{base_config.model_kind}'")
    missing = [d for d in request.directions if d not in base_config.directions]
    check_condition(not missing, f"{base_dir}: the base has no {', '.join(missing)} model")
    return dataclasses.replace(request, model_options=own_options, base_dir=base_dir,
                               resume=resume, overwrite=overwrite,
                               train_config=dataclasses.replace(
                                   train_config, **(request.layer_training or {})),
                               extra={**(request.extra or {}), "base": os.path.abspath(base_dir)})
