"""The training of one model directory around the training loop (aligner/training/loop.py).

:func:`train` takes a :class:`~aligner.training.request.TrainRequest` (what to train, on
which data, how), prepares its model directory (lock, --resume/--overwrite, the corpus of
aligner/training/corpus.py, config.json), then trains every direction: one after the other in
this process, each in a process of its own (aligner/training/directions.py), or both in one
loop (aligner/training/agreement.py, --agreement-weight). It trains exactly that directory:
self-training rounds are aligner/training/rounds.py's (each round one call of :func:`train`),
the stages of a kind trained on a frozen base aligner/training/recipe_guide.py's (its last
stage one call of :func:`train`, on the trained base). :func:`train_model_dir` is the same as
a call with the settings as arguments.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

import torch

from aligner import constants as C
from aligner.config import DataConfig, RunConfig, TrainConfig
from aligner.data import EncodedCorpus, TokenBatcher, encode_pair
from aligner.distributed import DistributedContext, distributed, resolve_device
from aligner.formats import Bitext
from aligner.log import log_run_info, setup_logging
from aligner.model_dir import (CORPUS_DIR, acquire_lock, config_path, direction_dir,
                               discard_unstarted_run, load_preprocessing, mark_run, params_path,
                               prepare_output_dir, recorded_checksum, release_lock,
                               write_version)
from aligner.models import model_class
from aligner.precision import resolve_precision
from aligner.training.run_record import RunRecord, record_path
from aligner.training.agreement import (check_agreement_options, check_agreement_resumable,
                                        train_agreement)
from aligner.training.corpus import (INPUTS_NAME, check_inputs, prepare_data, prepare_like,
                                     tokenize_bitext)
from aligner.training.directions import (DirectionRun, train_direction,
                                         train_directions_in_parallel)
from aligner.training.guidance import check_guide_file
from aligner.training.loop import TrainSummary, Validation, check_resumable
from aligner.training.request import TrainRequest
from aligner.utils import AlignerError, check_condition, remove_stale_temporaries
from aligner.vocab import Vocabulary

if TYPE_CHECKING:  # pragma: no cover
    from aligner.prep import Preprocessor, PrepConfig

logger = logging.getLogger(__name__)


def check_model_options(model_kind: str, model_options: Dict[str, Any],
                        valid_method: str = "") -> None:
    """Refuse (one line) model options that `model_kind`'s config does not accept and a
    validation method the kind does not have: checked before a run writes anything."""
    cls = model_class(model_kind)
    known = sorted(name for name in cls.config_class.__dataclass_fields__
                   if name not in ("src_vocab_size", "tgt_vocab_size"))
    unknown = sorted(set(model_options) - set(known))
    check_condition(not unknown, f"--model-option: unknown setting {', '.join(unknown)} for "
                                 f"--model {model_kind} (known: {', '.join(known)})")
    try:  # the config's own checks (placeholder vocabulary sizes: those come from the data)
        cls.config_class.from_dict({**model_options, "src_vocab_size": 8, "tgt_vocab_size": 8})
    except (TypeError, ValueError) as error:  # e.g. a text where a number belongs
        raise AlignerError(f"--model-option: invalid value for --model {model_kind} "
                           f"({error})") from None
    check_condition(not valid_method or valid_method in cls.METHODS,
                    f"--valid-method: unknown method '{valid_method}' for --model {model_kind} "
                    f"(choose from {', '.join(cls.METHODS)})")


def supports_guide(model_kind: str) -> bool:
    """Whether `model_kind`'s contract gives the alignment posterior the guide term is
    computed on (``TRAINS_POSTERIOR``; aligner/training/guidance.py,
    :func:`aligner.training.loop.guided_loss`)."""
    return model_class(model_kind).TRAINS_POSTERIOR


def direction_model_configs(model_options: Dict[str, Any], directions: Sequence[str],
                            n_src: int, n_tgt: int) -> Dict[str, Dict[str, Any]]:
    """Model config dict per direction: the options plus vocabulary sizes (swapped for rev)."""
    configs = {}
    for direction in directions:
        sizes = (n_src, n_tgt) if direction == "fwd" else (n_tgt, n_src)
        configs[direction] = {**model_options, "src_vocab_size": sizes[0],
                              "tgt_vocab_size": sizes[1]}
    return configs


def train_model_dir(model_dir: str, bitext: Bitext, model_kind: str,
                    model_options: Dict[str, Any], prep_config: "PrepConfig",
                    data_config: DataConfig, train_config: TrainConfig,
                    **settings: Any) -> Dict[str, TrainSummary]:
    """:func:`train` of ``TrainRequest(model_dir, bitext, ..., train_config, **settings)``;
    `settings`: the request's other fields by name (directions, valid_bitext, resume, ...)."""
    return train(TrainRequest(model_dir, bitext, model_kind, model_options, prep_config,
                              data_config, train_config, **settings))


def train(request: TrainRequest) -> Dict[str, TrainSummary]:
    """Prepare ``request.model_dir`` and train the model kind in every direction: `align
    train` of one model directory (one self-training round; the last stage of a kind trained
    on a frozen base, whose ``base_dir`` is then its trained base).

    Under torchrun every rank calls this; rank 0 prepares and writes. Returns the training
    summary per direction.

    The model options and validation method are checked before anything is written. With
    `resume`, `bitext` must be the bitext the cached corpus was encoded from (unless
    `ignore_data_change`: training continues on the cached corpus, see :func:`check_inputs`),
    and no direction may have weights without a training state (:func:`check_resumable`).

    parallel_directions (CPU only, not under torchrun): train the directions at the same time,
    each in its own process with an equal share of torch's threads (see
    :func:`train_directions_in_parallel`); otherwise one after the other.

    With `init_dir` (fine-tuning), the run is prepared with that model directory's BPE and
    vocabularies and every direction starts from its best weights (not when resumed: the
    checkpoint holds the weights then).

    A kind trained on a frozen base (a class attribute ``BASE_KIND``, e.g. the alignment layer
    on a transformer) trains here on the trained base ``base_dir``: its preprocessing and
    vocabularies, its weights copied into the new model (``load_base``), what is not frozen
    trained; the stages before (the recipe's guide, the base) are
    aligner/training/recipe_guide.py's.
    """
    check_request(request)
    kind = request.model_kind
    check_condition(model_class(kind).BASE_KIND is None or (request.base_dir is not None
                                                            and not request.recipe_guide),
                    f"'{kind}' trains in stages on a frozen base "
                    f"(aligner.training.recipe_guide.train_layer), not in one model directory")
    with distributed(request.train_config.device) as context:
        return _train_in_group(request, context)


def _train_in_group(request: TrainRequest, context: DistributedContext
                    ) -> Dict[str, TrainSummary]:
    """:func:`train` inside the process group `context` (one process: a 1-rank context)."""
    model_dir = request.model_dir

    device = resolve_device(request.train_config.device, context.local_rank,
                            context.local_world_size)
    precision = resolve_precision(request.train_config.precision, device)
    resumed = request.resume
    lock = record = None
    started = configured = False  # a fresh run began writing; its config.json is written
    try:
        if context.is_main:
            check_condition(not os.path.exists(model_dir) or os.path.isdir(model_dir),
                            f"{model_dir}: exists and is not a directory")
            os.makedirs(model_dir, exist_ok=True)
            lock = acquire_lock(model_dir)  # before anything is removed or written
            resumed = configured = _open_model_dir(request)
            if not resumed:
                mark_run(model_dir)         # first: marks the directory as a run of ours
                write_version(model_dir)
                started = True
            record = begin_record(request, resumed, device, precision, context.world_size)
        context.barrier()
        logfile = os.path.join(model_dir, C.LOG_NAME) if context.is_main else None
        log = setup_logging(quiet=request.quiet, verbose=request.verbose,
                            console=context.is_main, logfile=logfile)
        if context.is_main:
            log_run_info(log, request.argv)
            logger.info("device %s (%s), %d process(es); %d training pairs", device,
                        precision, context.world_size, len(request.bitext))
        preparing = time.time()
        if resumed:
            saved = RunConfig.load(config_path(model_dir))
            pre, src_vocab, tgt_vocab = load_preprocessing(model_dir)
        elif context.is_main and (request.base_dir or request.init_dir) is not None:
            pre, src_vocab, tgt_vocab = prepare_like(
                model_dir, request.base_dir or request.init_dir, request.bitext,
                request.data_config)
        elif context.is_main:
            pre, src_vocab, tgt_vocab = prepare_data(model_dir, request.bitext,
                                                      request.prep_config, request.data_config,
                                                      request.train_config.seed)
        if record is not None:
            if not resumed:
                record.add_stage("preparation", time.time() - preparing)
            record.set_inputs(run_inputs(request))
        context.barrier()
        if not resumed and not context.is_main:
            pre, src_vocab, tgt_vocab = load_preprocessing(model_dir)
        config = run_config(request, pre, len(src_vocab), len(tgt_vocab))
        if resumed:
            differences = saved.differences(config)
            check_condition(not differences,
                            f"{model_dir}: cannot resume, these settings differ from the saved "
                            f"run: {', '.join(differences)} (use --overwrite to start a new run)")
        if context.is_main:
            if not resumed:   # refused here, the run still leaves nothing behind
                check_batches(model_dir, request.train_config)
            config.save(config_path(model_dir))
            configured = True
        validation = _validation(request, pre, src_vocab, tgt_vocab)
        summaries = _train_directions(request, config, resumed, device, context, validation,
                                      record)
        context.barrier()
    except BaseException:
        if started and not configured:
            # stopped before training began: nothing to resume, so leave nothing behind
            # (the corrected command then starts in a clean directory)
            discard_unstarted_run(model_dir)
            if record is not None and record.has_stages_before(record.current_round):
                record.save()   # a self-training job's earlier rounds: --resume goes on
        raise
    finally:
        if lock is not None:
            release_lock(lock)
    return summaries


def begin_record(request: TrainRequest, resumed: bool, device: torch.device, precision: str,
                  processes: int) -> "RunRecord":
    """Rank 0, the model directory open: the run record this run adds to (the request's, the
    resumed run's, or a new one) with this process's session begun, saved."""
    record = request.record
    if record is None:
        record = (RunRecord.resumed(request.model_dir) if resumed
                  else RunRecord(record_path(request.model_dir)))
    parallel = (request.parallel_directions and len(request.directions) > 1
                and not request.agreement)
    record.begin_session(request.argv, request.directions, str(device), precision, processes,
                         torch.get_num_threads(), parallel,
                         deterministic=request.train_config.deterministic)
    record.save()   # (again for a later self-training round: its directory was just emptied)
    return record


def run_inputs(request: TrainRequest) -> Dict[str, Any]:
    """What the run record says of a run's inputs (the model directory prepared).

    ``bitext``: {"source", "target": the files as absolute paths (the same file twice for a
    joint bitext), "pairs": their number, "sha256": the bitext's fingerprint, the sha256 of its
    words pair by pair (:func:`bitext_fingerprint`, read from corpus/inputs.json: None for a
    corpus encoded by an older version)}; ``guide`` when trained with one: {"path", "sha256":
    of the file}; ``init_from`` / ``base`` when given: {"path", "sha256": {direction: the
    sha256 of its params.best.pt as its checksum file records it, None without one}}.
    """
    def absolute(path: str) -> str:
        return path if path == "-" else os.path.abspath(path)

    saved: Dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(request.model_dir, CORPUS_DIR, INPUTS_NAME),
                  encoding="utf-8") as handle:
            saved = json.load(handle)
    bitext = request.bitext
    inputs: Dict[str, Any] = {"bitext": {
        "source": absolute(bitext.source_name), "target": absolute(bitext.target_name),
        "pairs": len(bitext), "sha256": saved.get("sha256")}}
    if getattr(bitext, "description", ""):   # a self-training round's sample of the lines
        inputs["bitext"]["lines"] = bitext.description
    if request.data_config.guide:
        inputs["guide"] = {"path": absolute(request.data_config.guide),
                           "sha256": saved.get("guide_sha256")}
    for key, folder in (("init_from", request.init_dir), ("base", request.base_dir)):
        if folder is not None:
            inputs[key] = {"path": os.path.abspath(folder),
                           "sha256": {d: recorded_checksum(params_path(folder, d, "best"))
                                      for d in request.directions}}
    return inputs


def check_request(request: TrainRequest) -> None:
    """Refuse (one line) what the run cannot do, before anything is removed or written."""
    kind = request.model_kind
    check_condition(request.base_dir is None or model_class(kind).BASE_KIND is not None,
                    f"--base is only for model kinds trained on a frozen base, not '{kind}'")
    check_model_options(kind, request.model_options, request.train_config.valid_method)
    check_condition(not request.data_config.guide or supports_guide(kind),
                    f"--guide: guided alignment training is implemented for hmm0, hmm1 and "
                    f"alignment-layer, not '{kind}'")
    guided = bool(request.data_config.guide) or request.recipe_guide
    check_condition(request.train_config.guide_weight == 0 or guided,
                    "--guide-weight needs --guide")
    check_condition(not request.recipe_guide or (model_class(kind).BASE_KIND is not None
                                                 and not request.data_config.guide),
                    f"the recipe's guide (stage 0) is for a kind trained on a frozen base "
                    f"without --guide, not '{kind}'")
    if request.data_config.guide and os.path.isfile(request.data_config.guide):
        # (a pipe can be read once: it is checked while it is encoded)
        # the links against the words only where training sees the words as they are
        check_guide_file(request.data_config.guide, request.bitext,
                         check_links=not request.prep_config.tokenize
                         and request.init_dir is None and request.base_dir is None)
    if request.agreement:
        check_agreement_options(kind, request.directions, request.parallel_directions)
    if request.init_dir is not None:
        check_init_dir(request.init_dir, kind, request.directions, request.model_dir)


def check_init_dir(init_dir: str, model_kind: str, directions: Sequence[str],
                   model_dir: str) -> None:
    """``--init-from``: `init_dir` must be a trained model directory of `model_kind` with
    weights for every direction, not the directory being trained (it is rewritten)."""
    check_condition(model_class(model_kind).BASE_KIND is None,
                    f"--init-from: not for '{model_kind}', trained on a frozen base (--base)")
    check_condition(os.path.isfile(config_path(init_dir)),
                    f"{init_dir}: not a model directory ({C.CONFIG_NAME} is missing)")
    check_condition(not os.path.exists(model_dir)
                    or not os.path.samefile(init_dir, model_dir),
                    f"--init-from {init_dir}: the model directory being trained; copy it "
                    f"elsewhere first (or use --resume to continue its run)")
    init_config = RunConfig.load(config_path(init_dir))
    check_condition(init_config.model_kind == model_kind,
                    f"{init_dir}: holds a '{init_config.model_kind}' model, this run trains "
                    f"'{model_kind}'")
    for direction in directions:
        check_condition(os.path.isfile(params_path(init_dir, direction, "best")),
                        f"{init_dir}: no trained {direction} model to start from")


def check_batches(model_dir: str, train_config: TrainConfig) -> None:
    """The batcher's own checks on the encoded corpus (pairs left to train on, --max-tokens
    against the longest pair), before the run counts as configured: one error line, and a
    fresh run refused there removes what it wrote."""
    corpus = EncodedCorpus.open(os.path.join(model_dir, CORPUS_DIR))
    TokenBatcher.from_corpus(corpus, train_config.max_tokens, seed=train_config.seed)


def request_inputs(request: TrainRequest) -> List[str]:
    """The files a run reads (the bitext, the guide, the validation bitext): never removed by
    its --overwrite."""
    inputs = [request.bitext.source_name, request.bitext.target_name, request.data_config.guide]
    if request.valid_bitext is not None:
        inputs += [request.valid_bitext.source_name, request.valid_bitext.target_name]
    return [path for path in inputs if path]


def _open_model_dir(request: TrainRequest) -> bool:
    """Rank 0, holding the lock: make the model directory ready (:func:`prepare_output_dir`);
    when an earlier run is resumed, check its cached corpus and every direction before anything
    is trained. Returns whether the run is resumed."""
    model_dir = request.model_dir
    resumed = prepare_output_dir(model_dir, request.resume, request.overwrite,
                                 request_inputs(request))
    for folder in (model_dir, os.path.join(model_dir, CORPUS_DIR),
                   *(direction_dir(model_dir, d) for d in C.DIRECTIONS)):
        remove_stale_temporaries(folder)    # of a run killed while it wrote (the lock is ours)
    if resumed:
        saved = RunConfig.load(config_path(model_dir))
        check_inputs(model_dir, request.bitext, request.ignore_data_change,
                     request.data_config.guide or None,
                     start_dir=request.base_dir or request.init_dir,
                     saved_guide=saved.data.guide or None)
        if request.agreement:
            check_agreement_resumable(model_dir)
        elif model_class(request.model_kind).TRAINED_BY_EM:
            pass   # EM keeps no training state: cut off, it trains again; finished, it is kept
        else:
            for direction in request.directions:
                check_resumable(direction_dir(model_dir, direction))
    return resumed


def run_config(request: TrainRequest, pre: "Preprocessor", n_src: int, n_tgt: int
               ) -> RunConfig:
    """The run's config.json: the model configs per direction (vocabulary sizes from the data;
    in stage 2 the base's configs plus the kind's own options) and every setting."""
    directions = request.directions
    options = model_class(request.model_kind).config_class.recorded_options(
        request.model_options)
    models = direction_model_configs(options, directions, n_src, n_tgt)
    prep_config = request.prep_config
    extra = dict(request.extra or {})
    if request.init_dir is not None:  # fine-tuning: the model as it was trained
        init_config = RunConfig.load(config_path(request.init_dir))
        models = {d: dict(init_config.models[d]) for d in directions}
        prep_config = pre.config
        extra["init_from"] = os.path.abspath(request.init_dir)
    if request.base_dir is not None:  # stage 2: the base's model configs plus its own options
        base_config = RunConfig.load(config_path(request.base_dir))
        models = {d: {**base_config.models[d], **request.model_options} for d in directions}
        prep_config = pre.config
    return RunConfig(model_kind=request.model_kind, directions=list(directions), models=models,
                     prep=prep_config.to_dict(), data=request.data_config,
                     training=request.train_config, extra=extra)


def _validation(request: TrainRequest, pre: "Preprocessor", src_vocab: Vocabulary,
                tgt_vocab: Vocabulary) -> Optional[Validation]:
    """The validation pairs encoded like the training data (None without them)."""
    if request.valid_bitext is None:
        return None
    source, target = tokenize_bitext(pre, request.valid_bitext)
    return Validation([encode_pair(pre, src_vocab, tgt_vocab, s, t)
                       for s, t in zip(source, target)], request.valid_gold,
                      request.train_config.valid_method)


def _train_directions(request: TrainRequest, config: RunConfig, resumed: bool,
                      device: torch.device, context: DistributedContext,
                      validation: Optional[Validation], record: Optional["RunRecord"] = None
                      ) -> Dict[str, TrainSummary]:
    """Train every direction of the prepared model directory: together (agreement), each in
    a process of its own (parallel_directions) or one after the other; each one's seconds go
    into the run `record` (rank 0's; None on the other ranks) as it ends."""
    model_dir, directions, quiet = request.model_dir, request.directions, request.quiet
    runs = [DirectionRun(model_dir, config, direction, resumed, request.base_dir, validation,
                         progress=not quiet, position=position, init_dir=request.init_dir)
            for position, direction in enumerate(directions)]
    start = time.time()

    def finished(direction: str, parallel: bool = False) -> None:
        nonlocal start
        if record is not None:
            record.add_stage("training", time.time() - start, direction, parallel)
        if not parallel:
            start = time.time()

    if model_class(request.model_kind).TRAINED_BY_EM:   # the classical aligner
        from aligner.training.classical import train_model_dir as train_by_em

        if resumed and all(os.path.isfile(params_path(model_dir, d)) for d in directions):
            logger.info("%s: the classical model is trained; nothing to resume", model_dir)
            return {}
        summaries = train_by_em(model_dir, config, context.is_main)
        finished("+".join(directions))
        return summaries
    if request.agreement:
        summary = train_agreement(model_dir, config, resumed, device, context, validation,
                                  progress=not quiet, init_dir=request.init_dir)
        finished("+".join(C.DIRECTIONS))
        return {direction: summary for direction in directions}
    if request.parallel_directions and len(runs) > 1:
        check_condition(not context.enabled,
                        "--parallel-directions cannot be combined with torchrun (DDP trains "
                        "one direction at a time on all processes)")
        check_condition(device.type == "cpu",
                        f"--parallel-directions trains each direction in its own CPU "
                        f"process; on {device} train them one after the other (the default)")
        return train_directions_in_parallel(
            runs, quiet=quiet, verbose=request.verbose,
            finished=lambda direction: finished(direction, parallel=True))
    summaries = {}
    for run in runs:
        summaries[run.direction] = train_direction(run, device, context)
        finished(run.direction)
    return summaries
