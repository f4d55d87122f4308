"""The model directory: a self-contained trained aligner, and its save/load functions.

Layout (file names from aligner/constants.py)::

    MODEL_DIR/
      config.json          every hyper-parameter (RunConfig: versions, model kind, model configs
                           per direction, preprocessing, data, training, seed)
      version              the package version that wrote the directory
      prep.json            preprocessing config (aligner.prep.Preprocessor.save)
      bpe.src.codes        subword-nmt BPE codes (with "#version" header), source language
      bpe.tgt.codes        ... target language (the same file twice with joint BPE)
      vocab.src.json       subword vocabulary of the source language
      vocab.tgt.json       ... of the target language
      corpus/              the encoded training corpus (memory-mapped ids; needed by --resume)
      train.log            the training log
      .lock                only while a training process writes the directory (its pid)
      base/                alignment-layer only: the stage-1 transformer model directory (the
                           layer's params files hold the base weights too; extraction needs
                           only the top level)
      fwd/ rev/            one folder per direction ("fwd" models p(target | source)):
        params.best.pt     weights of the best checkpoint (validation AER, else perplexity,
                           else the last one)
        params.last.pt     weights of the last checkpoint
        training_state.pt  optimizer, batcher position, RNG states, counters (for --resume)
        metrics.tsv        one row per checkpoint

Weights files hold ``{"state_dict": ..., "extra_state": ...}`` and are read with
``torch.load(weights_only=True)``: loading never unpickles code. A model kind that needs more
than its parameters returns it from ``extra_state()`` (plain types only) and reads it back in
an optional ``load_extra_state(dict)`` method.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch

from aligner import __version__
from aligner import constants as C
from aligner.config import RunConfig
from aligner.models import build_model
from aligner.models.base import AlignmentModel
from aligner.prep import PREP_CONFIG_NAME, Preprocessor
from aligner.utils import AlignerError, atomic_output, check_condition
from aligner.vocab import Vocabulary

logger = logging.getLogger(__name__)

CORPUS_DIR = "corpus"
LOCK_NAME = ".lock"
#: stage-1 base model directory inside an alignment-layer model directory (see train_model_dir)
BASE_DIR = "base"
CHECKPOINTS = ("best", "last")
#: everything a training run writes at the top level (removed by --overwrite, nothing else is)
RUN_ENTRIES = (C.CONFIG_NAME, C.VERSION_NAME, PREP_CONFIG_NAME, C.BPE_CODES_SRC, C.BPE_CODES_TGT,
               C.VOCAB_SRC, C.VOCAB_TGT, CORPUS_DIR, C.LOG_NAME) + C.DIRECTIONS


def config_path(model_dir: str) -> str:
    return os.path.join(model_dir, C.CONFIG_NAME)


def direction_dir(model_dir: str, direction: str) -> str:
    return os.path.join(model_dir, direction)


def params_path(model_dir: str, direction: str, checkpoint: str = "best") -> str:
    check_condition(checkpoint in CHECKPOINTS,
                    f"checkpoint must be one of {', '.join(CHECKPOINTS)} (got '{checkpoint}')")
    name = C.PARAMS_BEST if checkpoint == "best" else C.PARAMS_LAST
    return os.path.join(model_dir, direction, name)


def prepare_output_dir(model_dir: str, resume: bool, overwrite: bool) -> bool:
    """Make `model_dir` ready for training; returns True when an earlier run is resumed.

    A missing or empty directory is created/used. A non-empty one is refused unless
    ``resume`` (it must hold a run: config.json) or ``overwrite`` (the files a run writes are
    removed first; other files are left alone).
    """
    check_condition(not (resume and overwrite), "--resume and --overwrite exclude each other")
    if os.path.exists(model_dir):
        check_condition(os.path.isdir(model_dir), f"{model_dir}: exists and is not a directory")
        entries = [name for name in os.listdir(model_dir)
                   if name not in (BASE_DIR, LOCK_NAME)]  # stage-1 base, the run lock
    else:
        entries = []
    if not entries:
        check_condition(not resume, f"{model_dir}: nothing to resume (the directory is empty "
                                    f"or missing)")
        os.makedirs(model_dir, exist_ok=True)
        return False
    if resume:
        check_condition(os.path.isfile(config_path(model_dir)),
                        f"{model_dir}: cannot resume, {C.CONFIG_NAME} is missing")
        return True
    check_condition(overwrite, f"{model_dir}: directory is not empty; use --resume to continue "
                               f"its run or --overwrite to replace it")
    for name in RUN_ENTRIES:
        path = os.path.join(model_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.unlink(path)
    return False


def acquire_lock(model_dir: str) -> str:
    """Mark `model_dir` as being written by this process (file ``.lock`` with its pid).

    Refuses (one line) while another live process holds the lock, so two ``align train`` runs
    never write the same directory at once; a lock left by a dead process is taken over.
    Returns the lock path for :func:`release_lock`.
    """
    path = os.path.join(model_dir, LOCK_NAME)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                with open(path, encoding="utf-8") as handle:
                    pid = int(handle.read().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            check_condition(not _alive(pid), f"{model_dir}: another training process (pid "
                                             f"{pid}) is writing this directory")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()}\n")
        return path
    raise AlignerError(f"{model_dir}: cannot take the run lock {path}")


def release_lock(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _alive(pid: int) -> bool:
    """Whether another process `pid` runs (this process's own old lock counts as stale)."""
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_version(model_dir: str) -> None:
    with atomic_output(os.path.join(model_dir, C.VERSION_NAME)) as out:
        out.write(__version__ + "\n")


def save_params(model: AlignmentModel, path: str) -> None:
    """Write the model's parameters (and extra state) atomically to `path`."""
    state = {"state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
             "extra_state": model.extra_state()}
    with atomic_output(path, "wb") as out:
        torch.save(state, out)


def load_checkpoint_file(path: str) -> Dict[str, Any]:
    """torch.load(weights_only=True) with one-line errors for a missing or damaged file."""
    check_condition(os.path.isfile(path), f"{path}: missing (model directory incomplete)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # damaged or foreign file: any unpickling error
        raise AlignerError(f"{path}: cannot be read as a weights file "
                           f"({type(error).__name__}: {str(error).splitlines()[0][:200]})"
                           ) from None


def load_params(model: AlignmentModel, path: str) -> None:
    """Load a file written by :func:`save_params` into `model` (strict key match)."""
    state = load_checkpoint_file(path)
    check_condition(isinstance(state, dict) and "state_dict" in state,
                    f"{path}: not a weights file of this toolkit")
    try:
        model.load_state_dict(state["state_dict"])
    except RuntimeError as error:
        raise AlignerError(f"{path}: weights do not fit the model in config.json "
                           f"({str(error).splitlines()[0][:200]})") from None
    loader = getattr(model, "load_extra_state", None)
    if loader is not None:
        loader(state.get("extra_state", {}))


def build_direction_model(config: RunConfig, direction: str) -> AlignmentModel:
    """A freshly initialized model of the run's kind for `direction`."""
    check_condition(direction in config.models,
                    f"this model directory has no '{direction}' model (it has "
                    f"{', '.join(config.directions)})")
    return build_model(config.model_kind, config.models[direction])


def load_model(model_dir: str, direction: str, checkpoint: str = "best",
               device: Optional[torch.device] = None) -> AlignmentModel:
    """The trained model of one direction, in eval mode, on `device` (default CPU)."""
    config = RunConfig.load(config_path(model_dir))
    model = build_direction_model(config, direction)
    load_params(model, params_path(model_dir, direction, checkpoint))
    return model.to(device or torch.device("cpu")).eval()


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
        preprocessor = Preprocessor.load(model_dir)
        src_vocab = Vocabulary.load(os.path.join(model_dir, C.VOCAB_SRC))
        tgt_vocab = Vocabulary.load(os.path.join(model_dir, C.VOCAB_TGT))
        models = {d: load_model(model_dir, d, checkpoint, device) for d in directions}
        return cls(model_dir, config, preprocessor, src_vocab, tgt_vocab, models)


def list_incomplete(model_dir: str, directions: List[str]) -> List[str]:
    """Files a complete model directory must have but `model_dir` lacks (for diagnostics)."""
    needed = [C.CONFIG_NAME, PREP_CONFIG_NAME, C.VOCAB_SRC, C.VOCAB_TGT]
    needed += [os.path.join(d, name) for d in directions for name in (C.PARAMS_BEST,
                                                                       C.PARAMS_LAST)]
    return [name for name in needed if not os.path.exists(os.path.join(model_dir, name))]
