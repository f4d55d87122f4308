"""One direction's training, in this process (:func:`train_direction`) or in a process of its
own (:func:`train_directions_in_parallel`, --parallel-directions: both directions of a CPU run
side by side, each with its share of the threads).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence

import torch

from aligner import constants as C
from aligner.config import RunConfig
from aligner.data import EncodedCorpus
from aligner.distributed import DistributedContext
from aligner.model_dir import CORPUS_DIR, load_checkpoint_file
from aligner.training.loop import (TrainSummary, Trainer, Validation, seed_everything,
                                   use_deterministic_algorithms)
from aligner.utils import AlignerError, os_error_message, sigterm_raises

if TYPE_CHECKING:  # pragma: no cover
    from aligner.models.base import AlignmentModel

logger = logging.getLogger(__name__)


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
    from aligner.malloc import keep_freed_memory

    keep_freed_memory()   # a spawned process starts with the C library's defaults
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
