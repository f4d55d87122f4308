"""Stage 0 of the guided alignment layer trained without --guide: the recipe's links of the
bitext, as the layer's guide.

Zenkel et al. (2020) train the alignment layer's attention on another aligner's links of the
training text. `align train --model alignment-layer` with no --guide (and without
``--layer-query prefix``, the unguided layer of 2019) takes the recipe's: it trains the recipe
(aligner/training/recipe.py: what `align run` trains with no flags) on the same bitext, aligns
every line with it (hmm-posterior, -H soft-average at the recipe's output threshold), and the
layer (stage 2, after its base: aligner/training/run.py) trains guided by those links::

    MODEL_DIR/guide/              the recipe's self-training run (aligner/training/rounds.py)
      links.align                 its alignments of the bitext, one line per line: the guide
                                  (written once complete, through links.align.parts)

--resume goes on where the stage stopped: in a round of the recipe, in its alignment of the
bitext (from its last finished block), or, with links.align written, with the stages after it;
the recipe's run refuses another bitext or other settings, as `align run --resume` does.
--overwrite trains every stage again: the replaced run's links.align and its parts, and the
files of its base and layer, are removed before stage 0 (each folder a run of ours), so that
--resume after a cut-off never takes them for the new run's.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Tuple

from aligner import constants as C
from aligner.training import recipe
from aligner.utils import check_condition

if TYPE_CHECKING:  # pragma: no cover
    from aligner.distributed import DistributedContext
    from aligner.training.rounds import SelfTraining
    from aligner.training.run import TrainRequest

logger = logging.getLogger(__name__)

#: MODEL_DIR/guide/links.align: the recipe's links of the bitext
LINKS_NAME = "links.align"


def guide_dir(model_dir: str) -> str:
    """MODEL_DIR/guide: the recipe's run that guides the layer."""
    from aligner.model_dir import GUIDE_DIR

    return os.path.join(model_dir, GUIDE_DIR)


def links_path(model_dir: str) -> str:
    """MODEL_DIR/guide/links.align (absolute): the layer's guide."""
    return os.path.abspath(os.path.join(guide_dir(model_dir), LINKS_NAME))


def recipe_job(request: "TrainRequest", resume: bool = False
               ) -> Tuple["TrainRequest", "SelfTraining"]:
    """The recipe's run (as `align run` with no flags: aligner/training/recipe_request.py) on
    ``request.bitext`` into MODEL_DIR/guide, both directions, on the request's device,
    precision and seed, with its tokenization and lowercasing (so that the links index the
    words the layer trains on); `resume`: the run in MODEL_DIR/guide goes on (its batches
    then its own, as for `align run --resume`). Returns (round 1's request, the plan)."""
    from aligner.prep import PrepConfig
    from aligner.training.recipe_request import recipe_request
    from aligner.training.rounds import SelfTraining

    given = request.train_config
    prep = request.prep_config
    if request.base_dir is not None:   # the words as the layer sees them: its base's
        from aligner.model_dir import load_preprocessing

        prep = load_preprocessing(request.base_dir)[0].config
    prep_config = PrepConfig(tokenize=prep.tokenize, src_lang=prep.src_lang,
                             tgt_lang=prep.tgt_lang, lowercase=prep.lowercase,
                             bpe_merges=recipe.bpe_merges(len(request.bitext)))
    job = recipe_request(guide_dir(request.model_dir), request.bitext, prep_config,
                         device=given.device, precision=given.precision,
                         deterministic=given.deterministic, seed=given.seed, resume=resume,
                         overwrite=request.overwrite, quiet=request.quiet,
                         verbose=request.verbose, argv=request.argv,
                         ignore_data_change=request.ignore_data_change)
    return job, SelfTraining()


def check_stages(request: "TrainRequest") -> None:
    """Rank 0, before stage 0: refuse (one line, nothing written) what a later stage would
    refuse only after hours of the recipe. A new run: the model directory and the stages'
    own (MODEL_DIR/guide, MODEL_DIR/base) must be new, empty, or runs of ours given
    --overwrite. --resume: some stage must hold a run, and a layer run already begun (its
    config.json) must be one trained on the recipe's links."""
    from aligner.config import RunConfig
    from aligner.model_dir import (BASE_DIR, GUIDE_DIR, check_new_run, config_path, holds_run,
                                   run_entries)
    from aligner.training.run import request_inputs

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


def train_guide(request: "TrainRequest", context: "DistributedContext") -> "TrainRequest":
    """Stage 0: train the recipe into MODEL_DIR/guide (with --resume: go on with it; a
    finished one is checked against the bitext and settings) and write its links of the
    bitext to MODEL_DIR/guide/links.align unless they are written (see the module
    docstring). Under torchrun every rank calls this (the rounds and the alignment are
    sharded, rank 0 writes). Returns the request of the stages after it: guided by those
    links."""
    import shutil

    from aligner.corpus_alignment import align_bitext
    from aligner.distributed import resolve_device
    from aligner.model_dir import holds_run
    from aligner.training.rounds import train_rounds

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
        from aligner.model_dir import BASE_DIR, remove_run_files

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
        align_bitext(folder, request.bitext, device, recipe.METHOD, plan.shortlist,
                     plan.heuristic, plan.output_threshold, {plan.heuristic: links},
                     quiet=request.quiet or not context.is_main,
                     precision=request.train_config.precision, parts=links + C.PARTS_SUFFIX,
                     resume=True, description="guide")
    context.barrier()
    return dataclasses.replace(request, recipe_guide=False,
                               data_config=dataclasses.replace(request.data_config, guide=links))
