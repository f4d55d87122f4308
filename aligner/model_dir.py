"""The model directory: a self-contained trained aligner, and its save/load functions.

Layout (file names from aligner/constants.py)::

    MODEL_DIR/
      config.json          every hyper-parameter (RunConfig: versions, model kind, model configs
                           per direction, preprocessing, data, training, seed); extra.align_run:
                           the -H / --threshold that align extract takes as its defaults here
      version              the package version that wrote the directory
      prep.json            preprocessing config (aligner.prep.Preprocessor.save)
      bpe.src.codes        subword-nmt BPE codes (with "#version" header), source language
      bpe.tgt.codes        ... target language (the same file twice with joint BPE)
      vocab.src.json       subword vocabulary of the source language
      vocab.tgt.json       ... of the target language
      corpus/              the encoded training corpus (memory-mapped ids; needed by --resume),
                           the subword links of a --guide, and inputs.json (names, pair count
                           and sha256 of the bitext it was built from)
      train.log            the training log
      alignment.parts/     align run's final alignment while it runs: the finished blocks'
                           lines (aligner/extract/blocks.py), removed once the outputs are written
                           (a self-training guide's: rounds/N/links.align.parts)
      .aligner             the mark of a directory written by a run of ours (written first;
                           --overwrite replaces only a directory that has it, or a config.json
                           of ours, and never removes it)
      run.json             the run record: command, inputs and their checksums, device, the
                           seconds of each stage of every session and self-training round
                           (aligner/training/run_record.py)
      .lock                the run lock: an OS lock on it is held while a training process
                           writes the directory (the file names its pid and host)
      rounds/              a self-training run's rounds (aligner/training/rounds.py): N/, round
                           N's model directory (with links.align, its links of round N+1's
                           lines, and done); 0/, the teacher as a classical model directory
                           (mixed into the output) and links.align, its links of round 1's
                           lines (its guide); settings.json, the rounds' settings (kept by
                           --resume). The top level then holds the last round's model:
                           config.json, the preprocessing and vocabularies, each direction's
                           params.best.pt
      joint/               agreement training (--agreement-weight): both directions' state
      base/                alignment-layer only: the stage-1 transformer model directory (the
                           layer's params files hold the base weights too; extraction needs
                           only the top level)
      guide/               alignment-layer without --guide: the stage-0 recipe run whose links
                           of the bitext (guide/links.align) guide the layer
                           (aligner/training/recipe_guide.py)
      fwd/ rev/            one folder per direction ("fwd" models p(target | source)):
        params.best.pt     weights of the best checkpoint (validation AER, else perplexity,
                           else the last one)
        params.last.pt     weights of the last checkpoint
        training_state.pt  optimizer, batcher position, RNG states, counters (for --resume)
        *.pt.sha256        the sha256 of each .pt file beside it (``sha256sum`` format, so
                           ``cd fwd && sha256sum -c params.best.pt.sha256`` checks it too)
        metrics.tsv        one row per checkpoint

Weights files hold ``{"state_dict": ..., "extra_state": ...}`` and are read with
``torch.load(weights_only=True)``: loading never unpickles code. A model kind that needs more
than its parameters returns it from ``extra_state()`` (plain types only) and reads it back in
``load_extra_state(dict)`` (both no-ops by default, aligner/models/base.py).

Every ``.pt`` file is written by :func:`save_checkpoint_file` and read by
:func:`load_checkpoint_file`, which verifies it against its ``.sha256`` file: a damaged file is
refused (one error line) instead of loading silently with other weights. Directories written
before checksums existed have no ``.sha256`` files; their ``.pt`` files load unverified.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from typing import IO, Any, Dict, List, Optional, Sequence, Tuple

import torch

from aligner import __version__
from aligner import constants as C
from aligner.config import RunConfig
from aligner.models import build_model
from aligner.models.base import AlignmentModel
from aligner.prep import PREP_CONFIG_NAME, Preprocessor
from aligner.utils import (AlignerError, atomic_output, check_condition, first_line,
                           open_no_follow, write_errors_named)
from aligner.vocab import Vocabulary

logger = logging.getLogger(__name__)

CORPUS_DIR = "corpus"
LOCK_NAME = ".lock"
#: stage-1 base model directory inside an alignment-layer model directory (see aligner.training.run)
BASE_DIR = "base"
#: stage-0 guide of an alignment layer trained without --guide: the recipe's run and its links
#: of the bitext (aligner/training/recipe_guide.py)
GUIDE_DIR = "guide"
#: the stages' own run directories inside a model directory: runs of their own, which the
#: top level's --overwrite leaves to them
STAGE_DIRS = (BASE_DIR, GUIDE_DIR)
#: the joint training state of an agreement run (aligner/training/agreement.py): both directions
#: train in one loop, their weights in fwd/ and rev/
JOINT_DIR = "joint"
CHECKPOINTS = ("best", "last")
#: everything a training run writes at the top level (removed by --overwrite, nothing else is)
RUN_ENTRIES = (C.CONFIG_NAME, C.VERSION_NAME, PREP_CONFIG_NAME, C.BPE_CODES_SRC, C.BPE_CODES_TGT,
               C.VOCAB_SRC, C.VOCAB_TGT, CORPUS_DIR, C.LOG_NAME, C.RUN_RECORD_NAME,
               JOINT_DIR, C.ALIGNMENT_PARTS, C.ROUNDS_DIR, C.CALIBRATION_NAME) + C.DIRECTIONS
#: what a self-training run copies from its last round's directory to its top level (the
#: model `align extract` reads; of each direction's folder only params.best.pt and its
#: checksum; each round's log and metrics stay in its directory), config.json last
PUBLISHED_ENTRIES = (C.VERSION_NAME, PREP_CONFIG_NAME, C.BPE_CODES_SRC, C.BPE_CODES_TGT,
                     C.VOCAB_SRC, C.VOCAB_TGT) + C.DIRECTIONS + (C.CONFIG_NAME,)


def config_path(model_dir: str) -> str:
    return os.path.join(model_dir, C.CONFIG_NAME)


def direction_dir(model_dir: str, direction: str) -> str:
    return os.path.join(model_dir, direction)


def params_path(model_dir: str, direction: str, checkpoint: str = "best") -> str:
    check_condition(checkpoint in CHECKPOINTS,
                    f"checkpoint must be one of {', '.join(CHECKPOINTS)} (got '{checkpoint}')")
    name = C.PARAMS_BEST if checkpoint == "best" else C.PARAMS_LAST
    return os.path.join(model_dir, direction, name)


def prepare_output_dir(model_dir: str, resume: bool, overwrite: bool,
                       inputs: Sequence[Optional[str]] = ()) -> bool:
    """Make `model_dir` ready for training; returns True when an earlier run is resumed.

    A missing or empty directory is created/used. A non-empty one is refused unless
    ``resume`` (it must hold a run: config.json) or ``overwrite``: then the files a run writes
    are removed first (other files are left alone), and only from a directory that holds a run
    of ours, none of whose files is a symbolic link or holds one of the run's `inputs`
    (:func:`check_overwritable`).
    """
    check_condition(not (resume and overwrite), "--resume and --overwrite exclude each other")
    entries = run_entries(model_dir)
    if not entries:
        check_condition(not resume, f"{model_dir}: nothing to resume (the directory is empty "
                                    f"or missing)")
        os.makedirs(model_dir, exist_ok=True)
        return False
    if resume:
        check_condition(os.path.isfile(config_path(model_dir)),
                        f"{model_dir}: cannot resume, {C.CONFIG_NAME} is missing"
                        + (" (its run stopped before training began: start it again with "
                           "--overwrite)" if holds_run(model_dir) else ""))
        return True
    check_new_run(model_dir, overwrite, inputs)
    mark_run(model_dir)   # first: a removal cut off still leaves a directory known as ours
    remove_run_files(model_dir)
    return False


def run_entries(model_dir: str) -> List[str]:
    """What `model_dir` holds but the stages' runs and the run lock ([] when it is missing)."""
    if not os.path.exists(model_dir):
        return []
    check_condition(os.path.isdir(model_dir), f"{model_dir}: exists and is not a directory")
    return [name for name in os.listdir(model_dir) if name not in (*STAGE_DIRS, LOCK_NAME)]


def check_new_run(model_dir: str, overwrite: bool, inputs: Sequence[Optional[str]] = ()
                  ) -> None:
    """Refuse (one line, nothing written) a new run in `model_dir` that
    :func:`prepare_output_dir` would refuse: a non-empty directory without `overwrite`, or one
    that --overwrite may not clear (:func:`check_overwritable`). Also the check of a stage
    that runs before the top level is prepared (the alignment layer's guide, stage 0)."""
    if not run_entries(model_dir):
        return
    check_condition(overwrite, f"{model_dir}: directory is not empty; use --resume to continue "
                               f"its run or --overwrite to replace it")
    check_overwritable(model_dir, inputs)


#: MODEL_DIR/.aligner: the mark of a directory that a run of ours writes, the first file a
#: run writes (before anything is removed or prepared) and never removed by --overwrite
RUN_MARK = ".aligner"
_RUN_MARK_TEXT = "a model directory written by aligner (align train / align run)\n"


def mark_run(model_dir: str) -> None:
    """Write MODEL_DIR/.aligner, which :func:`holds_run` recognizes."""
    with atomic_output(os.path.join(model_dir, RUN_MARK)) as out:
        out.write(_RUN_MARK_TEXT)


def holds_run(model_dir: str) -> bool:
    """Whether `model_dir` holds a run of ours: its ``.aligner`` mark, or a config.json of ours
    (directories written before the mark existed). A file named ``version`` is not enough:
    other projects have one too."""
    mark = os.path.join(model_dir, RUN_MARK)
    if os.path.isfile(mark) and not os.path.islink(mark):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            with open(mark, encoding="utf-8") as handle:
                if handle.read(200) == _RUN_MARK_TEXT:
                    return True
    config = config_path(model_dir)
    if os.path.isfile(config) and not os.path.islink(config):
        with contextlib.suppress(OSError, ValueError):
            with open(config, encoding="utf-8") as handle:
                saved = json.load(handle)
            return isinstance(saved, dict) and "model_kind" in saved and "models" in saved
    return False


def check_overwritable(model_dir: str, inputs: Sequence[Optional[str]] = ()) -> None:
    """Refuse (one line, before anything is removed) to --overwrite `model_dir` unless it holds
    a run of ours (:func:`holds_run`), none of the files a run writes there is a symbolic
    link (a run never makes one: it points at something of the user's), and none of `inputs`
    (the run's input files) lies among them."""
    present = sorted(name for name in os.listdir(model_dir)
                     if name not in (*STAGE_DIRS, LOCK_NAME))
    check_condition(holds_run(model_dir),
                    f"{model_dir}: --overwrite replaces a model directory written by align, and "
                    f"this one holds no run (no {RUN_MARK} mark, no {C.CONFIG_NAME} of ours; "
                    f"it holds {', '.join(present[:3])}{', ...' if len(present) > 3 else ''}): "
                    f"nothing was removed; choose a new or empty directory")
    for name in RUN_ENTRIES:
        path = os.path.join(model_dir, name)
        check_condition(not os.path.islink(path),
                        f"{path}: a symbolic link, which align never writes: --overwrite "
                        f"would remove what it points to (nothing was removed; remove the "
                        f"link yourself)")
    removed = [os.path.realpath(os.path.join(model_dir, name)) for name in RUN_ENTRIES]
    for path in inputs:
        if not path or path == "-":
            continue
        real = os.path.realpath(path)
        for entry in removed:
            check_condition(real != entry and not real.startswith(entry + os.sep),
                            f"{path}: an input of this run lies in {entry}, which --overwrite "
                            f"would remove (nothing was removed; move the input or choose "
                            f"another model directory)")


def discard_unstarted_run(model_dir: str) -> None:
    """Remove what a run that stopped before its training began (no config.json) wrote, so that
    the corrected command starts in a clean directory; the ``.aligner`` mark stays while other
    files remain (they belong to a run of ours: --overwrite may still remove them)."""
    remove_run_files(model_dir)
    if not any(name not in (*STAGE_DIRS, LOCK_NAME, RUN_MARK)
               for name in os.listdir(model_dir)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(model_dir, RUN_MARK))


def remove_run_files(model_dir: str) -> None:
    """Remove what a training run writes at the top level of `model_dir` (RUN_ENTRIES; symbolic
    links only as links), never its ``.aligner`` mark: a removal cut off (SIGKILL while the
    corpus or weights are removed) leaves a directory still recognized as a run of ours
    (:func:`holds_run`), which --resume or --overwrite can go on with. The run record goes
    last."""
    first = [name for name in RUN_ENTRIES if name != C.RUN_RECORD_NAME]
    for name in first + [C.RUN_RECORD_NAME]:
        path = os.path.join(model_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)


@dataclass
class RunLock:
    """The run lock of a model directory, held by this process until :func:`release_lock`.

    handle: the open ``.lock`` file that carries the OS lock (None where the file system has
    no locks and the run goes on unlocked).
    """

    path: str
    handle: Optional[IO[str]]


def acquire_lock(model_dir: str, holder_is: str = "another training process") -> RunLock:
    """Take the run lock of `model_dir`: an exclusive OS lock (``flock``) on ``MODEL_DIR/.lock``.

    Refuses (one line naming the holder's host and pid, which the file records, as
    `holder_is`) while another process holds the lock, so two ``align train`` runs never write
    the same directory at once (nor two ``align extract`` the same parts folder,
    aligner/extract/blocks.py).
    The OS drops the lock when its process ends, however it ends: a ``.lock`` file left by a
    crashed run, or one naming an unrelated live process, never blocks. Where the file system
    has no locks (or the OS has no ``flock``), a warning says so and the run goes on unlocked.
    """
    import socket

    try:
        import fcntl
    except ImportError:  # not a POSIX system
        fcntl = None
    path = os.path.join(model_dir, LOCK_NAME)
    while True:
        handle = os.fdopen(open_no_follow(path, os.O_RDWR, "run lock"), "r+", encoding="utf-8")
        if fcntl is None:
            return _unlocked(path, handle, "this system has no flock")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "pid unknown"
            handle.close()
            raise AlignerError(f"{model_dir}: {holder_is} ({holder}) is writing this "
                               f"directory") from None
        except OSError as error:  # e.g. ENOLCK, EOPNOTSUPP: a file system without locks
            return _unlocked(path, handle, error.strerror or type(error).__name__)
        if _is_current_file(handle, path):
            break
        handle.close()  # its holder released (removed) it between our open and flock: again
    try:
        with write_errors_named(path):   # a full disk: one line naming the lock file
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} on host {socket.gethostname()}\n")
            handle.flush()
    except BaseException:   # not locked after all: the lock file goes (its close may fail too)
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            handle.close()
        raise
    return RunLock(path, handle)


def release_lock(lock: RunLock) -> None:
    """Remove the ``.lock`` file, then drop the OS lock (in this order, so that a process
    waiting on the old file notices that it was removed and locks the next one)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(lock.path)
    if lock.handle is not None:
        lock.handle.close()


def _is_current_file(handle: IO[str], path: str) -> bool:
    """Whether the open `handle` is still the file at `path` (not removed or replaced)."""
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(handle.fileno())
    return (mine.st_dev, mine.st_ino) == (current.st_dev, current.st_ino)


def _unlocked(path: str, handle: IO[str], reason: str) -> RunLock:
    """A RunLock without an OS lock, with a warning that concurrent runs go undetected."""
    handle.close()
    logger.warning("%s: cannot lock (%s); two runs writing this model directory at once "
                   "would not be detected", path, reason)
    return RunLock(path, None)


def write_version(model_dir: str) -> None:
    with atomic_output(os.path.join(model_dir, C.VERSION_NAME)) as out:
        out.write(__version__ + "\n")


#: suffix of the file holding a checkpoint file's sha256 ("params.best.pt.sha256")
CHECKSUM_SUFFIX = ".sha256"
_SHA256_LINE = re.compile(r"([0-9a-f]{64})  (\S.*)")


def checksum_path(path: str) -> str:
    """The checksum file of checkpoint file `path`."""
    return path + CHECKSUM_SUFFIX


def file_sha256(path: str) -> str:
    """Hex sha256 of the file's content (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_checkpoint_file(state: Dict[str, Any], path: str) -> None:
    """torch.save `state` atomically to `path` and record its sha256 in ``path.sha256``.

    The checksum line is in ``sha256sum`` format. The new file is written in full (to a
    temporary file) before anything old is touched: a full disk leaves the old file and its
    checksum as they were. Then the old checksum file is removed and the new weights replace
    the old ones, then the new checksum is written: an interruption between those steps leaves
    a file without checksum (loaded unverified), never a checksum that belongs to other
    weights.
    """
    sums = checksum_path(path)

    def drop_old_checksum() -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sums)

    with atomic_output(path, "wb", before_replace=drop_old_checksum) as out:
        hashing = _HashingWriter(out)   # torch.save streams to the file: no copy in memory
        try:
            torch.save(state, hashing)
        except RuntimeError:   # torch's writer turns a failed write into its own error
            if hashing.error is not None:
                raise hashing.error from None   # the OSError (a full disk), named by atomic_output
            raise
    with atomic_output(sums) as out:
        out.write(f"{hashing.sha256.hexdigest()}  {os.path.basename(path)}\n")


class _HashingWriter:
    """A binary file that also hashes what is written to it (sha256): what torch.save needs
    of a file object. A checkpoint written through it is never held whole in memory (the
    classical teacher's tables of a 407k-line run: 71 MB per direction, which a BytesIO held
    twice over while it grew, beside the tables themselves)."""

    def __init__(self, handle: IO[bytes]):
        self.handle = handle
        self.sha256 = hashlib.sha256()
        #: the first write's OSError, which torch.save reports as a RuntimeError of its own
        self.error: Optional[OSError] = None

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        try:
            return self.handle.write(data)
        except OSError as error:
            self.error = self.error or error
            raise

    def flush(self) -> None:
        try:
            self.handle.flush()
        except OSError as error:
            self.error = self.error or error
            raise


def weights_state(model: AlignmentModel) -> Dict[str, Any]:
    """``{"state_dict": ..., "extra_state": ...}`` of `model`, on the CPU (what a weights file
    holds)."""
    return {"state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "extra_state": model.extra_state()}


def save_params(model: AlignmentModel, path: str) -> None:
    """Write the model's parameters (and extra state) atomically to `path` (with checksum)."""
    save_checkpoint_file(weights_state(model), path)


def recorded_checksum(path: str) -> Optional[str]:
    """The sha256 that ``path.sha256`` records for checkpoint file `path` (not recomputed);
    None without a readable checksum file."""
    try:
        with open(checksum_path(path), encoding="utf-8") as handle:
            match = _SHA256_LINE.fullmatch(handle.readline().rstrip("\n"))
    except (OSError, UnicodeDecodeError):
        return None
    return match.group(1) if match else None


def model_checksums(model_dir: str, directions: Sequence[str],
                    checkpoint: str = "best") -> Dict[str, str]:
    """What identifies the model that aligns (a parts folder records it, aligner/extract/blocks.py):
    the sha256 of each direction's `checkpoint` weights (the one its ``.sha256`` file
    records, else computed) and of the files extraction reads beside them (config,
    preprocessing, BPE codes, vocabularies); "" for a file that is missing."""
    sums = {}
    for direction in directions:
        path = params_path(model_dir, direction, checkpoint)
        sums[direction] = recorded_checksum(path) or (file_sha256(path)
                                                      if os.path.isfile(path) else "")
    for name in (C.CONFIG_NAME, PREP_CONFIG_NAME, C.BPE_CODES_SRC, C.BPE_CODES_TGT,
                 C.VOCAB_SRC, C.VOCAB_TGT):
        path = os.path.join(model_dir, name)
        sums[name] = file_sha256(path) if os.path.isfile(path) else ""
    return sums


def verify_checksum(path: str) -> None:
    """Compare `path` with the sha256 in ``path.sha256``; AlignerError naming the file if they
    differ. A file without checksum (written by an older version) passes unverified."""
    sums = checksum_path(path)
    try:
        with open(sums, encoding="utf-8") as handle:
            line = handle.readline().rstrip("\n")
    except FileNotFoundError:
        logger.debug("%s: no %s file (written by an older version): not verified", path,
                     CHECKSUM_SUFFIX)
        return
    except (OSError, UnicodeDecodeError) as error:
        raise AlignerError(f"{sums}: cannot be read as a checksum file ({first_line(error)})"
                           ) from None
    match = _SHA256_LINE.fullmatch(line)
    check_condition(match is not None, f"{sums}:1: not a sha256 checksum line "
                                       f"('HEX  NAME' expected)")
    check_condition(file_sha256(path) == match.group(1),
                    f"{path}: checksum mismatch, the file is damaged (its sha256 differs from "
                    f"the one recorded in {os.path.basename(sums)} when it was written)")


def load_checkpoint_file(path: str) -> Dict[str, Any]:
    """torch.load(weights_only=True) of a file written by :func:`save_checkpoint_file`, its
    checksum verified; one-line errors for a missing, empty or damaged file."""
    check_condition(os.path.isfile(path), f"{path}: missing (model directory incomplete)")
    check_condition(os.path.getsize(path) > 0, f"{path}: empty file (the model directory is "
                                               f"damaged)")
    verify_checksum(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # damaged or foreign file: any unpickling error
        message = first_line(error)
        raise AlignerError(f"{path}: cannot be read as a weights file ({type(error).__name__}"
                           f"{': ' + message if message else ''})") from None


def load_params(model: AlignmentModel, path: str) -> None:
    """Load a file written by :func:`save_params` into `model` (strict key match)."""
    load_weights_state(model, load_checkpoint_file(path), path)


def load_weights_state(model: AlignmentModel, state: Any, path: str) -> None:
    """Load a :func:`weights_state` dict (read from `path`, named in errors) into `model`."""
    check_condition(isinstance(state, dict) and "state_dict" in state,
                    f"{path}: not a weights file of this toolkit")
    try:
        model.load_state_dict(state["state_dict"])
    except RuntimeError as error:
        raise AlignerError(f"{path}: weights do not fit the model in config.json "
                           f"({first_line(error)})") from None
    model.load_extra_state(state.get("extra_state", {}))


def build_direction_model(config: RunConfig, direction: str) -> AlignmentModel:
    """A freshly initialized model of the run's kind for `direction`."""
    check_condition(direction in config.models,
                    f"this model directory has no '{direction}' model (it has "
                    f"{', '.join(config.directions)})")
    return build_model(config.model_kind, config.models[direction])


def load_model(model_dir: str, direction: str, checkpoint: str = "best",
               device: Optional[torch.device] = None) -> AlignmentModel:
    """The trained model of one direction, in eval mode, on `device` (default CPU).

    Needs only config.json and the weights; :meth:`LoadedModelDir.load` also checks the
    vocabularies against the config (before the model is built)."""
    config = RunConfig.load(config_path(model_dir))
    return _load_direction(model_dir, config, direction, checkpoint, device)


def _load_direction(model_dir: str, config: RunConfig, direction: str, checkpoint: str,
                    device: Optional[torch.device]) -> AlignmentModel:
    """Build the model of `direction` from `config` (read from `model_dir`) and load its
    weights; a bad model config is one error line naming config.json and the direction."""
    try:
        model = build_direction_model(config, direction)
    except AlignerError as error:
        raise AlignerError(f"{config_path(model_dir)}: models.{direction}: {error}") from None
    except (RuntimeError, MemoryError) as error:  # e.g. sizes too large to allocate
        raise AlignerError(f"{config_path(model_dir)}: models.{direction}: cannot build the "
                           f"model ({type(error).__name__}: {first_line(error)})") from None
    load_params(model, params_path(model_dir, direction, checkpoint))
    return model.to(device or torch.device("cpu")).eval()


def load_vocabularies(model_dir: str, config: RunConfig) -> Tuple[Vocabulary, Vocabulary]:
    """The source and target vocabularies of `model_dir`, checked against the vocabulary sizes
    of every model config in `config` (one error line naming the vocabulary file: a hand-edited
    or foreign vocabulary would otherwise map words to the wrong ids silently)."""
    vocabs = {}
    for side, name in (("src", C.VOCAB_SRC), ("tgt", C.VOCAB_TGT)):
        path = os.path.join(model_dir, name)
        vocabs[side] = Vocabulary.load(path)
        for direction in config.directions:
            # the "fwd" model reads the source language and predicts the target; "rev" swaps
            encoder_side = "src" if direction == "fwd" else "tgt"
            key = "src_vocab_size" if side == encoder_side else "tgt_vocab_size"
            stated = config.models[direction].get(key)
            check_condition(stated == len(vocabs[side]),
                            f"{path}: {len(vocabs[side])} tokens, but {C.CONFIG_NAME} gives "
                            f"{stated!r} (models.{direction}.{key}): the vocabulary does not "
                            f"belong to this model")
    return vocabs["src"], vocabs["tgt"]


def load_preprocessing(model_dir: str, config: Optional[RunConfig] = None
                       ) -> Tuple[Preprocessor, Vocabulary, Vocabulary]:
    """The preprocessor (prep.json, BPE codes) and the source and target vocabularies of
    `model_dir`; given its `config`, the vocabularies are checked against it
    (:func:`load_vocabularies`)."""
    preprocessor = Preprocessor.load(model_dir)
    if config is not None:
        return (preprocessor, *load_vocabularies(model_dir, config))
    return (preprocessor, Vocabulary.load(os.path.join(model_dir, C.VOCAB_SRC)),
            Vocabulary.load(os.path.join(model_dir, C.VOCAB_TGT)))


@dataclass
class LoadedModelDir:
    """Everything extraction needs from a model directory.

    models: trained model per loaded direction (eval mode, on the chosen device).
    """

    path: str
    config: RunConfig
    preprocessor: Preprocessor
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    models: Dict[str, AlignmentModel]

    @classmethod
    def load(cls, model_dir: str, directions: Sequence[str] = C.DIRECTIONS,
             checkpoint: str = "best", device: Optional[torch.device] = None
             ) -> "LoadedModelDir":
        check_condition(os.path.isdir(model_dir), f"{model_dir}: no such model directory")
        config = RunConfig.load(config_path(model_dir))
        missing = [d for d in directions if d not in config.directions]
        check_condition(not missing, f"{model_dir}: the model was trained for "
                                     f"{', '.join(config.directions)} only, not "
                                     f"{', '.join(missing)}")
        preprocessor, src_vocab, tgt_vocab = load_preprocessing(model_dir, config)
        models = {d: _load_direction(model_dir, config, d, checkpoint, device)
                  for d in directions}
        return cls(model_dir, config, preprocessor, src_vocab, tgt_vocab, models)

    def subword_pooling(self, given: Optional[str] = None) -> str:
        """How the soft matrices combine a word's subwords (aligner.extract.inference
        word_matrix): `given`, else the pooling the directory's calibration.json was measured
        with (a record without ``subword pooling``: the mean, as every record before the key),
        so that its thresholds fit the posteriors they scale, else the recipe's
        (recipe.SUBWORD_POOLING)."""
        from aligner.extract.calibrate import read_calibration
        from aligner.extract.inference import check_subword_pooling, recorded_pooling
        from aligner.training import recipe

        if given is not None:
            check_subword_pooling(given)
            return given
        record = read_calibration(self.path)
        return recipe.SUBWORD_POOLING if record is None else recorded_pooling(record)

    def symmetrization(self, heuristic: Optional[str] = None,
                       threshold: Optional[float] = None,
                       calibrated: bool = True) -> Tuple[str, Any]:
        """(heuristic, soft-average threshold) with the defaults filled in: those `align run`
        (or a self-training `align train`) recorded in config.json
        (``extra[constants.ALIGN_RUN_SETTINGS]``) for the model it trained, else the model
        kind's ``BEST_HEURISTIC`` and
        aligner.links.soft_symmetrize.DEFAULT_THRESHOLD. A recorded threshold applies only to the
        recorded heuristic. With `calibrated`, a soft heuristic's threshold (given or recorded)
        is scaled per line length by the model directory's calibration.json, where it has one
        (aligner.links.calibration.LengthThresholds; written after self-training rounds and by
        `align calibrate`)."""
        from aligner.extract.calibrate import read_calibration
        from aligner.links.calibration import Calibration
        from aligner.links.soft_symmetrize import DEFAULT_THRESHOLD
        from aligner.training import recipe

        recorded = recorded_symmetrization(self.path, self.config)
        heuristic = (heuristic or recorded.get("symmetrize")
                     or next(iter(self.models.values())).BEST_HEURISTIC)
        own = heuristic == recorded.get("symmetrize")
        if hasattr(threshold, "for_shape"):   # thresholds per line length, resolved already
            return heuristic, threshold
        if threshold is None:
            threshold = (recorded["threshold"] if own and "threshold" in recorded
                         else DEFAULT_THRESHOLD)
        if calibrated and heuristic in C.SOFT_HEURISTICS:
            record = read_calibration(self.path)
            if record is not None:
                return heuristic, Calibration.from_dict(record).thresholds(
                    float(threshold), recipe.CALIBRATION_BETA)
        return heuristic, float(threshold)


def recorded_symmetrization(model_dir: str, config: RunConfig) -> Dict[str, Any]:
    """``extra[constants.ALIGN_RUN_SETTINGS]`` of config.json, checked (one error line naming
    config.json and the key): a dict with an optional known ``symmetrize`` heuristic and an
    optional ``threshold`` in [0, 1), an optional ``mix_weight`` in [0, 1] and an optional
    ``mix_length`` (a whole number, 0 or more)."""
    key = f"{config_path(model_dir)}: extra.{C.ALIGN_RUN_SETTINGS}"
    recorded = config.extra.get(C.ALIGN_RUN_SETTINGS, {})
    check_condition(isinstance(recorded, dict),
                    f"{key}: expected {{\"symmetrize\": HEURISTIC, \"threshold\": NUMBER}}, "
                    f"got {recorded!r}")
    # a key may be absent (not recorded), but a recorded value must be one: null (None), a
    # list or a number where a name is expected would fail later with a TypeError
    known = C.HEURISTICS + C.SOFT_HEURISTICS
    if "symmetrize" in recorded:
        heuristic = recorded["symmetrize"]
        check_condition(isinstance(heuristic, str) and heuristic in known,
                        f"{key}.symmetrize: {_json_value(heuristic)} is not a heuristic "
                        f"(expected one of {', '.join(known)})")
    if "threshold" in recorded:
        threshold = recorded["threshold"]
        check_condition(isinstance(threshold, (int, float)) and not isinstance(threshold, bool)
                        and 0.0 <= threshold < 1.0,
                        f"{key}.threshold: {_json_value(threshold)} is not a probability "
                        f"threshold (a number from 0 up to, not including, 1)")
    if "mix_weight" in recorded:
        weight = recorded["mix_weight"]
        check_condition(isinstance(weight, (int, float)) and not isinstance(weight, bool)
                        and 0.0 <= weight <= 1.0,
                        f"{key}.mix_weight: {_json_value(weight)} is not a weight (a number "
                        f"from 0 to 1)")
    if "mix_length" in recorded:
        length = recorded["mix_length"]
        check_condition(isinstance(length, int) and not isinstance(length, bool)
                        and length >= 0,
                        f"{key}.mix_length: {_json_value(length)} is not a line length (a "
                        f"whole number of words, 0 or more)")
    return recorded


def _json_value(value: Any) -> str:
    """`value` as config.json spells it where Python's repr differs (null, true, false),
    else its repr, at most 60 characters."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def list_incomplete(model_dir: str, directions: List[str], checkpoint: str = "best"
                    ) -> List[str]:
    """Files `model_dir` lacks that `align extract --checkpoint CHECKPOINT` loads (for
    diagnostics). A self-training run's MODEL_DIR holds its last round's best weights only
    (aligner/training/rounds.py): it has no ``--checkpoint last``."""
    needed = [C.CONFIG_NAME, PREP_CONFIG_NAME, C.VOCAB_SRC, C.VOCAB_TGT]
    params = C.PARAMS_BEST if checkpoint == "best" else C.PARAMS_LAST
    needed += [os.path.join(d, params) for d in directions]
    return [name for name in needed if not os.path.exists(os.path.join(model_dir, name))]
