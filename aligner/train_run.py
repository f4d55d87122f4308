"""A whole `align train` run around the training loop of aligner/train.py.

:func:`train` takes a :class:`TrainRequest` (what to train, on which data, how; passed on as
one object, e.g. to stage 1 of a two-stage kind), prepares the model directory (lock,
--resume/--overwrite, BPE, vocabularies, the encoded corpus and the record of the data it came
from, config.json), then trains every direction: one after the other in this process
(:func:`train_direction`), each in a process of its own (:func:`train_directions_in_parallel`,
--parallel-directions), or both in one loop (:func:`train_agreement`, --agreement-weight).
Kinds trained on a frozen base run two stages (:func:`_base_stage`). :func:`train_model_dir`
is the same as a call with the settings as arguments. The loop itself, checkpoints and
resuming are :class:`aligner.train.Trainer`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional,
                    Sequence, Tuple)

import torch

from aligner import constants as C
from aligner import faults
from aligner.config import DataConfig, RunConfig, TrainConfig
from aligner.data import EncodedCorpus
from aligner.distributed import DistributedContext
from aligner.formats import Bitext, BitextFiles, GoldAlignment
from aligner.model_dir import CORPUS_DIR, load_checkpoint_file, load_preprocessing
from aligner.models import model_class
from aligner.train import (TrainSummary, Trainer, Validation, check_resumable,
                           seed_everything, use_deterministic_algorithms)
from aligner.utils import (AlignerError, atomic_output, check_condition, os_error_message,
                           remove_stale_temporaries, sigterm_raises)
from aligner.vocab import Vocabulary

if TYPE_CHECKING:  # pragma: no cover
    from aligner.models.base import AlignmentModel
    from aligner.prep import Preprocessor, PrepConfig
    from aligner.run_record import RunRecord

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# One direction's training, in this process or in a process of its own
# ---------------------------------------------------------------------------------------------

@dataclass
class DirectionRun:
    """Everything training one direction needs beyond the files in `model_dir` (picklable, so
    that a --parallel-directions process can receive it).

    base_dir: the frozen base of a stage-2 run (alignment layer), else None; init_dir: a
    trained model directory whose weights the model starts from (``--init-from``), else None;
    position: the row of this direction's progress bar when several are shown at once.
    """

    model_dir: str
    config: RunConfig
    direction: str
    resume: bool
    base_dir: Optional[str] = None
    validation: Optional[Validation] = None
    progress: bool = True
    position: int = 0
    init_dir: Optional[str] = None


def train_direction(run: DirectionRun, device: torch.device,
                    context: Optional[DistributedContext] = None) -> TrainSummary:
    """Build the direction's model (seeded with the run's seed) and train it into
    MODEL_DIR/DIRECTION from the encoded corpus in MODEL_DIR/corpus."""
    from aligner.model_dir import build_direction_model, direction_dir, params_path

    context = context or DistributedContext()
    use_deterministic_algorithms(run.config.training.deterministic)  # also in a spawned process
    seed_everything(run.config.training.seed)
    model = build_direction_model(run.config, run.direction)
    if run.base_dir is not None:  # stage 2 starts from the trained base (frozen by load_base)
        base_weights = load_checkpoint_file(params_path(run.base_dir, run.direction, "best"))
        model.load_base(base_weights["state_dict"])
    # fine-tuning starts from init_dir's weights; a resumed direction from its own checkpoint
    # (one cut off before its first checkpoint has none: it starts as the run did)
    resumable = run.resume and os.path.isfile(
        os.path.join(direction_dir(run.model_dir, run.direction), C.TRAINING_STATE))
    if run.init_dir is not None and not resumable:
        load_init_weights(model, run.init_dir, run.direction)
    if context.is_main:
        n_params = sum(p.numel() for p in model.parameters())
        n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
        logger.info("[%s] %s model: %d parameters (%d trained)", run.direction,
                    run.config.model_kind, n_params, n_train)
    corpus = EncodedCorpus.open(os.path.join(run.model_dir, CORPUS_DIR))
    sizes = run.config.models[run.direction]
    vocab_sizes = (sizes["src_vocab_size"], sizes["tgt_vocab_size"])
    corpus.check_ids(*(vocab_sizes if run.direction == "fwd" else vocab_sizes[::-1]))
    trainer = Trainer(model, corpus, run.direction, run.config.training,
                      direction_dir(run.model_dir, run.direction), device, context,
                      run.validation, progress=run.progress, progress_position=run.position)
    return trainer.run(resume=run.resume)


def load_init_weights(model: AlignmentModel, init_dir: str, direction: str) -> None:
    """Copy the best weights of `direction` in the model directory `init_dir` into `model`
    (``--init-from``: same kind, sizes and vocabularies, :func:`check_init_dir`)."""
    from aligner.model_dir import load_params, params_path

    load_params(model, params_path(init_dir, direction, "best"))
    logger.info("[%s] weights of %s", direction, init_dir)


def _direction_process(connection: Any, run: DirectionRun, threads: int, quiet: bool,
                       verbose: bool) -> None:
    """Body of one --parallel-directions process: log like the parent, train on the CPU, send
    ("done", TrainSummary), ("error", AlignerError) or ("crash", traceback text) back."""
    import signal
    import sys
    import traceback

    from aligner.log import setup_logging

    training = True

    def stop(signum: int, frame: Any) -> None:
        """The parent's terminate() while training: exit normally, so that multiprocessing
        cleans up (tqdm's lock); once training is over the process is already on its way out,
        and an exception raised in its interpreter shutdown would only print noise."""
        if training:
            sys.exit(1)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the parent stops us
    signal.signal(signal.SIGTERM, stop)
    try:
        torch.set_num_threads(threads)
        setup_logging(quiet=quiet, verbose=verbose,
                      logfile=os.path.join(run.model_dir, C.LOG_NAME))
        connection.send(("done", train_direction(run, torch.device("cpu"))))
    except AlignerError as error:
        connection.send(("error", error))
    except OSError as error:  # the system's (a full disk): one line, as in the parent
        connection.send(("error", AlignerError(f"[{run.direction}] "
                                               f"{os_error_message(error)}")))
    except Exception:  # a bug: its traceback goes to the parent
        connection.send(("crash", traceback.format_exc()))
    finally:
        training = False
        connection.close()


#: `align train` / `align run` / `align demo` train the directions side by side by default
#: from this many training pairs on (two processes take a few seconds to start)
PARALLEL_MIN_PAIRS = 1000


def default_parallel_directions(device: torch.device, directions: Sequence[str],
                                agreement_weight: float, n_pairs: int,
                                one_thread_each: bool = False) -> bool:
    """Whether the directions train side by side (:func:`train_directions_in_parallel`) when
    not asked: on a CPU with 2+ cores and torch threads, two directions trained apart (no
    agreement), one process (not torchrun), at least :data:`PARALLEL_MIN_PAIRS` pairs. On 2
    cores the hmm1 recipe trains 1.1-1.6x faster so (eval/results/parallel_directions.md), to
    the weights of training them in turn with one thread each.

    one_thread_each: the torch threads do not count (align demo, whose default --threads 1
    means one thread for each direction: two cores for its small model).
    """
    from aligner.distributed import torchrun_world_size

    return (device.type == "cpu" and (os.cpu_count() or 1) >= 2 and len(directions) > 1
            and (one_thread_each                              # align demo
                 or torch.get_num_threads() >= len(directions))   # --threads 1: one core
            and agreement_weight == 0 and torchrun_world_size() == 1
            and n_pairs >= PARALLEL_MIN_PAIRS)


def train_directions_in_parallel(runs: Sequence[DirectionRun], quiet: bool = False,
                                 verbose: bool = False,
                                 finished: Optional[Callable[[str], None]] = None
                                 ) -> Dict[str, TrainSummary]:
    """Train each run's direction at the same time in its own ("spawn") process on the CPU.

    Each process gets ``torch.get_num_threads() // len(runs)`` threads (at least 1); with that
    many threads per direction the weights are the same as when the directions train one after
    the other (the directions share nothing but the read-only corpus). The first process to
    fail stops the others and its error is raised here; so do Ctrl-C and SIGTERM (checkpoints
    are written atomically, so ``--resume`` continues from the last one of each direction).
    `finished`: called with each direction as its result arrives.
    """
    import multiprocessing
    from multiprocessing.connection import wait

    threads = max(1, torch.get_num_threads() // len(runs))
    logger.info("training %s in parallel: %d processes with %d thread(s) each",
                ", ".join(run.direction for run in runs), len(runs), threads)
    context = multiprocessing.get_context("spawn")
    processes, waiting = [], {}
    summaries: Dict[str, TrainSummary] = {}
    with sigterm_raises():   # `kill` of this process stops the direction processes too
        try:
            for run in runs:
                receiver, sender = context.Pipe(duplex=False)
                process = context.Process(target=_direction_process, name=f"train-{run.direction}",
                                          args=(sender, run, threads, quiet, verbose))
                process.start()
                sender.close()
                processes.append(process)
                waiting[receiver] = (run.direction, process)
            while waiting:
                for receiver in wait(list(waiting)):
                    direction, process = waiting.pop(receiver)
                    try:
                        status, value = receiver.recv()
                    except EOFError:
                        process.join()
                        raise AlignerError(f"[{direction}] the training process ended without a "
                                           f"result (exit code {process.exitcode})") from None
                    if status == "error":
                        raise value
                    if status == "crash":
                        raise RuntimeError(f"[{direction}] training failed:\n{value}")
                    summaries[direction] = value
                    if finished is not None:
                        finished(direction)
            for process in processes:  # each has sent its result: let it end on its own
                process.join()
        finally:  # after an error, Ctrl-C or SIGTERM: stop the processes still training
            for process in processes:
                if process.is_alive():
                    process.terminate()
                process.join()
    return {run.direction: summaries[run.direction] for run in runs}


# ---------------------------------------------------------------------------------------------
# A whole run: prepare the model directory, then train every direction
# ---------------------------------------------------------------------------------------------

class _TokenizedSide:
    """One side of a bitext after the preprocessor's tokenization/lowercasing, re-iterable:
    each pass tokenizes the side's sentences again (nothing is kept)."""

    def __init__(self, pre: "Preprocessor", sentences: Iterable[List[str]], side: str):
        self.pre, self.sentences, self.side = pre, sentences, side

    def __iter__(self) -> Iterator[List[str]]:
        for words in self.sentences:
            yield self.pre.tokenize_line(" ".join(words), self.side)

    def __len__(self) -> int:
        return len(self.sentences)  # type: ignore[arg-type]


def tokenize_bitext(pre: "Preprocessor", bitext: "Bitext | BitextFiles"
                    ) -> Tuple[Iterable[List[str]], Iterable[List[str]]]:
    """Words of both sides after the preprocessor's tokenization/lowercasing (if any): the
    bitext's own sides when it has neither, else re-iterable views that tokenize as they go
    (in memory only for an in-memory :class:`Bitext`)."""
    if not (pre.config.tokenize or pre.config.lowercase):
        return bitext.source, bitext.target
    if isinstance(bitext, Bitext):
        return ([pre.tokenize_line(" ".join(words), "src") for words in bitext.source],
                [pre.tokenize_line(" ".join(words), "tgt") for words in bitext.target])
    return _TokenizedSide(pre, bitext.source, "src"), _TokenizedSide(pre, bitext.target, "tgt")


#: in MODEL_DIR/corpus: which bitext the cached corpus was encoded from (see record_inputs)
INPUTS_NAME = "inputs.json"


def update_fingerprint(digest: "hashlib._Hash", source: Sequence[str],
                       target: Sequence[str]) -> None:
    """Add one pair's words to a sha256 fingerprint (see :func:`bitext_fingerprint`)."""
    digest.update(f"{' '.join(source)}\t{' '.join(target)}\n".encode("utf-8"))


def bitext_fingerprint(bitext: "Bitext | BitextFiles") -> str:
    """sha256 of the bitext's words, pair by pair (the same for the same text however its
    files are named, spaced or stored); one pass, one pair in memory at a time."""
    digest = hashlib.sha256()
    for source, target in bitext:
        update_fingerprint(digest, source, target)
    return digest.hexdigest()


def _bitext_names(bitext: Bitext) -> str:
    """'train.src + train.tgt', or the one file of a joint bitext."""
    if bitext.source_name == bitext.target_name:
        return bitext.source_name
    return f"{bitext.source_name} + {bitext.target_name}"


def start_weights(start_dir: str) -> Dict[str, str]:
    """{direction: sha256 of params.best.pt} of the model directory a run starts from
    (--init-from, or the base of stage 2): what is compared on --resume, wherever it lies."""
    from aligner.model_dir import file_sha256, params_path, recorded_checksum

    paths = {direction: params_path(start_dir, direction, "best") for direction in C.DIRECTIONS}
    # the checksum written beside the weights (checked on every load), hashed only without one
    return {direction: recorded_checksum(path) or file_sha256(path)
            for direction, path in paths.items() if os.path.isfile(path)}


def record_inputs(model_dir: str, bitext: "Bitext | BitextFiles",
                  fingerprint: Optional[str] = None, guide: Optional[str] = None,
                  start_dir: Optional[str] = None) -> None:
    """Write MODEL_DIR/corpus/inputs.json: the files, pair count and fingerprint of the bitext
    the cached corpus is encoded from, and the sha256 of its `guide` file, if any
    (:func:`check_inputs` compares them on --resume); `fingerprint`: its
    :func:`bitext_fingerprint` when already known."""
    from aligner.model_dir import file_sha256

    record = {"files": _bitext_names(bitext), "pairs": len(bitext),
              "sha256": fingerprint or bitext_fingerprint(bitext)}
    if guide is not None and os.path.isfile(guide):   # (a pipe was read once, when encoded)
        record["guide_sha256"] = file_sha256(guide)
    if start_dir is not None:
        record["start_weights_sha256"] = start_weights(start_dir)
    with atomic_output(os.path.join(model_dir, CORPUS_DIR, INPUTS_NAME)) as out:
        json.dump(record, out, indent=2, sort_keys=True)
        out.write("\n")


def check_inputs(model_dir: str, bitext: Bitext, ignore_change: bool = False,
                 guide: Optional[str] = None, start_dir: Optional[str] = None,
                 saved_guide: Optional[str] = None) -> None:
    """On --resume: refuse (one line) when `bitext` is not the bitext the cached corpus of
    `model_dir` was encoded from, unless `ignore_change` (then training continues on the cached
    corpus and `bitext` is not used). Likewise for the `guide` file: it is compared by content,
    wherever it lies now (a run resumed from another directory, or after the model directory
    moved, names it by another path). A corpus without a record (written by an older version)
    cannot be checked: a warning says so."""
    from aligner.model_dir import file_sha256

    path = os.path.join(model_dir, CORPUS_DIR, INPUTS_NAME)
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
        recorded = (str(record["files"]), int(record["pairs"]), str(record["sha256"]))
    except FileNotFoundError:
        logger.warning("%s: missing (written by an older version): cannot check that %s is the "
                       "data the cached corpus was built from", path, _bitext_names(bitext))
        return
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise AlignerError(f"{path}: not a record of the training data ({error})") from None
    files, pairs, fingerprint = recorded
    guide_sha256 = record.get("guide_sha256")
    if guide is not None and not ignore_change:
        if guide_sha256 is not None:
            changed = os.path.isfile(guide) and file_sha256(guide) != guide_sha256
        else:   # recorded before guides were fingerprinted: compare where they lie
            changed = (saved_guide is not None
                       and os.path.realpath(saved_guide) != os.path.realpath(guide))
        if changed:
            raise AlignerError(f"{guide}: not the guide the run's corpus was encoded with "
                               f"(its content differs); --resume would go on training with "
                               f"the old one (use --overwrite to train with this guide)")
    recorded_start = record.get("start_weights_sha256")
    if start_dir is not None and recorded_start is not None:
        now = start_weights(start_dir)
        check_condition(all(now.get(d) == sha for d, sha in recorded_start.items()),
                        f"{start_dir}: not the model the run started from (its weights "
                        f"differ); a direction without a checkpoint would start from these "
                        f"(use --overwrite to start anew from them)")
    if fingerprint == bitext_fingerprint(bitext):
        return
    if ignore_change:
        logger.warning("%s differs from the data of the cached corpus (%s, %d pairs): "
                       "continuing on the cached corpus (--resume-ignore-data-change)",
                       _bitext_names(bitext), files, pairs)
        return
    what = ("changed since the run's corpus was built from it" if files == _bitext_names(bitext)
            else f"not the data the run's corpus was built from ({files})")
    raise AlignerError(f"{_bitext_names(bitext)}: {what}: {pairs} pairs then, {len(bitext)} "
                       f"now, different text; --resume would go on training on the old corpus "
                       f"(use --overwrite to train on the new data, or "
                       f"--resume-ignore-data-change to continue on the old corpus)")


def _encode_and_save(pre, src_vocab, tgt_vocab, source, target, model_dir: str,
                     data_config, bitext: "Bitext | BitextFiles",
                     fingerprint: Optional[str] = None, start_dir: Optional[str] = None) -> None:
    """Encode the training corpus into MODEL_DIR/corpus (with the record of the bitext it came
    from, `bitext`) and save prep, BPE and vocabularies. `source` / `target`: the bitext's
    (tokenized) sides, iterated once for the corpus and once more for a guide."""
    from aligner.data import encode_corpus

    corpus_dir = os.path.join(model_dir, CORPUS_DIR)
    encode_corpus(pre, src_vocab, tgt_vocab, source, target, corpus_dir,
                  max_len=data_config.max_len, max_ratio=data_config.max_ratio)
    if data_config.guide:
        _encode_guide(pre, data_config.guide, source, target, corpus_dir)
    record_inputs(model_dir, bitext, fingerprint, guide=data_config.guide or None,
                  start_dir=start_dir)
    pre.save(model_dir)
    src_vocab.save(os.path.join(model_dir, C.VOCAB_SRC))
    tgt_vocab.save(os.path.join(model_dir, C.VOCAB_TGT))


def _encode_guide(pre, path: str, source, target, corpus_dir: str) -> None:
    """Read the --guide file (Pharaoh word links of the training lines as training sees their
    words) line by line beside the bitext, check it (one error line) and store its subword
    links beside the encoded corpus (aligner/guide.py)."""
    from aligner.formats import iter_pharaoh
    from aligner.guide import encode_guides

    line_numbers = EncodedCorpus.open(corpus_dir).line_numbers
    n_word_links, n_links = encode_guides(pre, iter_pharaoh(path), source, target,
                                          line_numbers, corpus_dir, path)
    logger.info("guide %s: %d word links, %d subword links over %d training pairs", path,
                n_word_links, n_links, len(line_numbers))


def _prepare_data(model_dir: str, bitext: "Bitext | BitextFiles", prep_config: "PrepConfig",
                  data_config: DataConfig, seed: int
                  ) -> Tuple["Preprocessor", Vocabulary, Vocabulary]:
    """Learn BPE, build vocabularies, encode the corpus into MODEL_DIR/corpus (rank 0 only).

    Two passes over the bitext, one pair in memory at a time: the first counts the words
    (and fingerprints the bitext), BPE and the vocabularies are learned from the counts, the
    second encodes (a third reads a --guide beside the bitext). With
    ``bpe_sample_sentences`` BPE is learned on a sample drawn in the first pass."""
    faults.reached("preparation")
    from aligner.prep import Preprocessor, WordCounts, _reservoir_sample

    start = time.time()
    tokenizer = Preprocessor(prep_config)
    retokenize = prep_config.tokenize or prep_config.lowercase
    counts, digest = WordCounts(), hashlib.sha256()
    sample_size = prep_config.bpe_sample_sentences if prep_config.bpe_merges > 0 else 0

    def counted() -> Iterator[Tuple[List[str], List[str]]]:
        for src, tgt in bitext:
            update_fingerprint(digest, src, tgt)
            if retokenize:
                src = tokenizer.tokenize_line(" ".join(src), "src")
                tgt = tokenizer.tokenize_line(" ".join(tgt), "tgt")
            counts.add(src, tgt)
            yield src, tgt

    if sample_size:
        sample = _reservoir_sample(counted(), sample_size, seed)
        pre = Preprocessor.learn(prep_config, [s for s, _ in sample], [t for _, t in sample])
    else:
        for _ in counted():
            pass
        pre = Preprocessor.learn_from_counts(prep_config, counts)
    src_vocab = Vocabulary.from_counts(pre.subword_counts(counts.src, "src"))
    tgt_vocab = Vocabulary.from_counts(pre.subword_counts(counts.tgt, "tgt"))
    logger.info("vocabularies: %d source and %d target subwords (with 4 specials)",
                len(src_vocab), len(tgt_vocab))
    source, target = tokenize_bitext(tokenizer, bitext)
    _encode_and_save(pre, src_vocab, tgt_vocab, source, target, model_dir, data_config,
                     bitext, digest.hexdigest())
    logger.info("preparation took %.1fs", time.time() - start)
    return pre, src_vocab, tgt_vocab


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


def supports_agreement(model_kind: str) -> bool:
    """Whether `model_kind` gives the differentiable posteriors agreement training compares."""
    return model_class(model_kind).TRAINS_POSTERIOR


def check_agreement_options(model_kind: str, directions: Sequence[str],
                            parallel_directions: bool) -> None:
    """One error line for an --agreement-weight run that cannot be: a kind without
    posteriors, one direction only, or each direction in its own process."""
    check_condition(supports_agreement(model_kind),
                    f"--agreement-weight: agreement training is implemented for the direct HMMs "
                    f"(hmm0, hmm1), not '{model_kind}'")
    check_condition(sorted(directions) == sorted(C.DIRECTIONS),
                    "--agreement-weight trains both directions together: it needs both "
                    "(not --directions " + ",".join(directions) + ")")
    check_condition(not parallel_directions,
                    "--agreement-weight trains both directions in one loop: it cannot be "
                    "combined with --parallel-directions")


def train_agreement(model_dir: str, config: RunConfig, resume: bool, device: torch.device,
                    context: Optional[DistributedContext] = None,
                    validation: Optional[Validation] = None,
                    progress: bool = True, init_dir: Optional[str] = None) -> TrainSummary:
    """Build both directions' models (seeded; from `init_dir`'s weights when given) and train
    them together with the agreement term (aligner/agreement.py) from the encoded corpus in
    MODEL_DIR/corpus."""
    from aligner.agreement import AgreementPair, AgreementTrainer
    from aligner.model_dir import JOINT_DIR, build_direction_model

    context = context or DistributedContext()
    use_deterministic_algorithms(config.training.deterministic)
    seed_everything(config.training.seed)
    models = {direction: build_direction_model(config, direction)
              for direction in C.DIRECTIONS}
    # a resumed run continues from its joint checkpoint; one cut off before it has none
    resumable = resume and os.path.isfile(os.path.join(model_dir, JOINT_DIR, C.TRAINING_STATE))
    if init_dir is not None and not resumable:
        for direction, model in models.items():
            load_init_weights(model, init_dir, direction)
    pair = AgreementPair(models["fwd"], models["rev"], config.training.agreement_weight)
    if context.is_main:
        logger.info("[fwd+rev] %s models trained together, agreement weight %g: %d parameters",
                    config.model_kind, config.training.agreement_weight,
                    sum(p.numel() for p in pair.parameters()))
    corpus = EncodedCorpus.open(os.path.join(model_dir, CORPUS_DIR))
    sizes = config.models["fwd"]
    corpus.check_ids(sizes["src_vocab_size"], sizes["tgt_vocab_size"])
    trainer = AgreementTrainer(pair, corpus, config.training, model_dir, device, context,
                               validation, progress)
    return trainer.run(resume=resume)


def supports_guide(model_kind: str) -> bool:
    """Whether `model_kind`'s contract gives the alignment posterior the guide term is
    computed on (``TRAINS_POSTERIOR``; aligner/guide.py, :func:`aligner.train.guided_loss`)."""
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


@dataclass(frozen=True)
class TrainRequest:
    """One `align train` run as :func:`train` takes it (and passes on, e.g. to stage 1).

    model_dir: where the run goes; bitext: the training pairs; model_kind / model_options: the
    model config without vocabulary sizes (those come from the data); prep_config, data_config,
    train_config: preprocessing, corpus filtering / guide, training. directions: the models to
    train. valid_bitext / valid_gold: optional validation pairs (words as in `bitext`) and
    their gold alignments. resume / overwrite: continue or replace an earlier run in
    `model_dir`; ignore_data_change: with `resume`, continue on the cached corpus even if
    `bitext` differs (:func:`check_inputs`). quiet / verbose: console logging; argv: the
    command line, logged. extra: more settings for config.json's ``extra``. base_dir: a
    trained base model directory for a kind trained on a frozen base (``align train --base``).
    parallel_directions: each direction in a process of its own (see :func:`train`).
    init_dir: a trained model directory of the same kind to start from (``align train
    --init-from``, fine-tuning): its preprocessing, vocabularies, model configs and best
    weights; `prep_config` and `model_options` are then not used. record: the run record the
    run adds its session and stages to (a self-training job's, kept across its rounds,
    aligner/self_training.py); None: a new one, or for `resume` MODEL_DIR/run.json's.
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

    @property
    def agreement(self) -> bool:
        """Both directions trained together (--agreement-weight)."""
        return self.train_config.agreement_weight > 0


def train_model_dir(model_dir: str, bitext: Bitext, model_kind: str,
                    model_options: Dict[str, Any], prep_config: "PrepConfig",
                    data_config: DataConfig, train_config: TrainConfig,
                    **settings: Any) -> Dict[str, TrainSummary]:
    """:func:`train` of ``TrainRequest(model_dir, bitext, ..., train_config, **settings)``;
    `settings`: the request's other fields by name (directions, valid_bitext, resume, ...)."""
    return train(TrainRequest(model_dir, bitext, model_kind, model_options, prep_config,
                              data_config, train_config, **settings))


def train(request: TrainRequest) -> Dict[str, TrainSummary]:
    """`align train`: prepare ``request.model_dir`` and train the model kind in every direction.

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

    Model kinds trained on a frozen base (a class attribute ``BASE_KIND``, e.g. the
    alignment layer on a transformer) train in two stages: stage 1 is an ordinary run of
    ``BASE_KIND`` into ``MODEL_DIR/base`` (skipped when `base_dir` names a trained model
    directory of that kind, ``align train --base``); stage 2 reuses the base's preprocessing
    and vocabularies, copies the base's weights into the new model (``load_base``) and trains
    what is not frozen. Model size comes from the base; of `model_options` only the kind's own
    options (``split_options``) apply in stage 2.
    """
    from aligner.distributed import distributed

    check_request(request)
    # one process group for the whole run: stage 1 of a two-stage kind trains inside it
    with distributed(request.train_config.device) as context:
        if model_class(request.model_kind).BASE_KIND is not None:
            request = _base_stage(request)
        return _train_in_group(request, context)


def _train_in_group(request: TrainRequest, context: DistributedContext
                    ) -> Dict[str, TrainSummary]:
    """:func:`train` inside the process group `context` (one process: a 1-rank context)."""
    from aligner.distributed import resolve_device
    from aligner.log import log_run_info, setup_logging
    from aligner.model_dir import (acquire_lock, config_path, discard_unstarted_run,
                                   mark_run, release_lock, write_version)

    model_dir = request.model_dir
    from aligner.precision import resolve_precision

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
            pre, src_vocab, tgt_vocab = _prepare_like(
                model_dir, request.base_dir or request.init_dir, request.bitext,
                request.data_config)
        elif context.is_main:
            pre, src_vocab, tgt_vocab = _prepare_data(model_dir, request.bitext,
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
    from aligner.run_record import RunRecord, record_path

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
    from aligner.model_dir import params_path, recorded_checksum

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
                    f"--guide: guided alignment training is implemented for the direct HMMs "
                    f"(hmm0, hmm1), not '{kind}'")
    check_condition(request.train_config.guide_weight == 0 or bool(request.data_config.guide),
                    "--guide-weight needs --guide")
    if request.data_config.guide and os.path.isfile(request.data_config.guide):
        # (a pipe can be read once: it is checked while it is encoded)
        from aligner.guide import check_guide_file

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
    from aligner.model_dir import config_path, params_path

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
    from aligner.data import TokenBatcher

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
    from aligner.model_dir import config_path, direction_dir, prepare_output_dir

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
            from aligner.agreement import check_agreement_resumable

            check_agreement_resumable(model_dir)
        else:
            for direction in request.directions:
                check_resumable(direction_dir(model_dir, direction))
    return resumed


def run_config(request: TrainRequest, pre: "Preprocessor", n_src: int, n_tgt: int
               ) -> RunConfig:
    """The run's config.json: the model configs per direction (vocabulary sizes from the data;
    in stage 2 the base's configs plus the kind's own options) and every setting."""
    from aligner.model_dir import config_path

    directions = request.directions
    models = direction_model_configs(request.model_options, directions, n_src, n_tgt)
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
    from aligner.data import encode_pair

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


def _base_stage(request: TrainRequest) -> TrainRequest:
    """Stage 1 of a kind trained on a frozen base: train the base into MODEL_DIR/base (unless
    `base_dir` is given), check it. Returns the request of stage 2: the kind's own model
    options, the base directory (also recorded in config.json's ``extra``), and resume only
    when stage 2 had started."""
    import dataclasses

    from aligner.model_dir import BASE_DIR, config_path

    model_kind, train_config = request.model_kind, request.train_config
    cls = model_class(model_kind)
    base_kind = cls.BASE_KIND
    base_options, own_options = cls.split_options(request.model_options)
    base_dir, resume = request.base_dir, request.resume
    if base_dir is None:
        base_dir = os.path.join(request.model_dir, BASE_DIR)
        base_methods = model_class(base_kind).METHODS
        stage1 = train_config
        if train_config.valid_method and train_config.valid_method not in base_methods:
            stage1 = dataclasses.replace(train_config, valid_method="")
        logger.info("stage 1: training the %s base into %s", base_kind, base_dir)
        train(dataclasses.replace(request, model_dir=base_dir, model_kind=base_kind,
                                  model_options=base_options, train_config=stage1, extra=None,
                                  base_dir=None, record=None))
        # stage 2 resumes only when it had started (it writes config.json first)
        resume = resume and os.path.isfile(config_path(request.model_dir))
    check_condition(os.path.isfile(config_path(base_dir)),
                    f"{base_dir}: not a model directory ({C.CONFIG_NAME} is missing)")
    base_config = RunConfig.load(config_path(base_dir))
    check_condition(base_config.model_kind == base_kind,
                    f"{base_dir}: the base of '{model_kind}' must be a '{base_kind}' model "
                    f"directory, this one holds '{base_config.model_kind}'")
    missing = [d for d in request.directions if d not in base_config.directions]
    check_condition(not missing, f"{base_dir}: the base has no {', '.join(missing)} model")
    return dataclasses.replace(request, model_options=own_options, base_dir=base_dir,
                               resume=resume,
                               extra={**(request.extra or {}), "base": os.path.abspath(base_dir)})


def _prepare_like(model_dir: str, other_dir: str, bitext: Bitext, data_config: DataConfig
                  ) -> Tuple["Preprocessor", Vocabulary, Vocabulary]:
    """Stage 2 (`other_dir` = the base) or ``--init-from`` (the model fine-tuned): the other
    model directory's preprocessing and vocabularies (copied into `model_dir`) and the training
    corpus (and guide) encoded with them into MODEL_DIR/corpus (rank 0 only)."""
    faults.reached("preparation")
    start = time.time()
    pre, src_vocab, tgt_vocab = load_preprocessing(other_dir)
    source, target = tokenize_bitext(pre, bitext)
    _encode_and_save(pre, src_vocab, tgt_vocab, source, target, model_dir, data_config,
                     bitext, start_dir=other_dir)
    logger.info("preprocessing and vocabularies of %s", other_dir)
    logger.info("preparation took %.1fs", time.time() - start)
    return pre, src_vocab, tgt_vocab
