"""The training loop, generic over :class:`aligner.models.base.AlignmentModel`.

One :class:`Trainer` trains one direction's model on an encoded corpus:

* only parameters with ``requires_grad`` are optimized (a model kind can freeze a base network
  and train a new part with the same loop);
* Adam with linear warm-up and inverse-square-root decay; gradient clipping; gradient
  accumulation over ``update_freq`` batches; the loss of an update is the sum over its tokens
  divided by the number of tokens of the whole update (all batches, all ranks);
* a checkpoint every ``checkpoint_interval`` updates and at the end: validation (perplexity and,
  with a gold set, AER), ``params.last.pt``, ``params.best.pt`` when validation improved (lower
  AER; without gold, lower perplexity; without validation data, every checkpoint is the best),
  ``training_state.pt`` and ``metrics.tsv``;
* resuming from ``training_state.pt`` continues with exactly the batches, RNG states,
  optimizer state and counters of the interrupted run, so N updates in one go and N/2 + resume
  + N/2 give bit-identical parameters (on CPU);
* DDP under torchrun: gradients are averaged over ranks, every rank takes its own shard of each
  epoch's batches, only rank 0 writes files and logs to the console;
* on CUDA the forward pass runs under bf16 autocast (parameters and optimizer stay fp32).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from aligner import constants as C
from aligner.config import DataConfig, RunConfig, TrainConfig
from aligner.data import EncodedCorpus, EncodedPair, TokenBatcher, make_batch
from aligner.distributed import DistributedContext
from aligner.formats import Bitext, GoldAlignment
from aligner.inference import align_pairs, pair_batches
from aligner.metrics import score_aer
from aligner.model_dir import (CORPUS_DIR, load_checkpoint_file, load_params,
                               load_preprocessing, save_checkpoint_file, save_params)
from aligner.models import model_class
from aligner.models.base import AlignmentModel
from aligner.utils import AlignerError, atomic_output, check_condition
from aligner.vocab import Vocabulary

if TYPE_CHECKING:  # pragma: no cover
    from aligner.prep import Preprocessor, PrepConfig

logger = logging.getLogger(__name__)

METRICS_COLUMNS = ("update", "epoch", "train_loss", "train_ppl", "valid_ppl", "valid_aer", "lr",
                   "tokens_per_s", "elapsed_s")


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's (CPU and CUDA) global generators."""
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


def learning_rate(config: TrainConfig, update: int) -> float:
    """Learning rate of update number `update` (1-based): linear warm-up, then lr·sqrt(w/u)."""
    if config.warmup == 0:
        return config.lr
    return config.lr * min(update / config.warmup, math.sqrt(config.warmup / update))


def autocast_context(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA; nothing on CPU (fp32 there)."""
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class _LossModule(nn.Module):
    """Wraps ``model.loss`` as ``forward`` so that DistributedDataParallel can hook it."""

    def __init__(self, model: AlignmentModel):
        super().__init__()
        self.model = model

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                label_smoothing: float, **guide: Any):
        """``guide``: optional ``guide``/``guide_weight`` keywords (aligner/guide.py)."""
        return self.model.loss(src, tgt_in, tgt_out, label_smoothing=label_smoothing, **guide)


@dataclass
class Validation:
    """Held-out pairs for validation: perplexity and, given `gold`, AER of one method.

    pairs: encoded pairs (source and target language as in the training data); gold: gold
    alignments of the same pairs (source–target, word level) or None.
    """

    pairs: List[EncodedPair]
    gold: Optional[List[GoldAlignment]] = None
    method: str = ""
    max_tokens: int = 4000

    @torch.no_grad()
    def perplexity(self, model: AlignmentModel, direction: str, device: torch.device) -> float:
        """exp(mean NLL per target token, EOS included), no label smoothing, eval mode."""
        model.eval()
        total, tokens, batches = 0.0, 0, 0
        for _, batch in pair_batches(model, self.pairs, direction, self.max_tokens, device):
            with autocast_context(device):
                loss, n_tokens = model.loss(batch.src, batch.tgt_in, batch.tgt_out, 0.0)
            total += float(loss)
            tokens += int(n_tokens)
            batches += 1
        if not batches:   # no pair the model can take
            return float("nan")
        return math.exp(min(total / max(tokens, 1), 100.0))

    def aer(self, model: AlignmentModel, direction: str, device: torch.device) -> Optional[float]:
        """AER (0..1) of this direction's alignments with `method`, or None without gold."""
        if self.gold is None:
            return None
        method = self.method or model.METHODS[0]
        links = align_pairs(model, self.pairs, direction, method, self.max_tokens, device)
        return score_aer(links, self.gold).aer


@dataclass
class TrainState:
    """Counters of a run (saved in training_state.pt together with optimizer and RNG states)."""

    updates: int = 0
    tokens: int = 0                 # target tokens trained on, all ranks
    elapsed: float = 0.0            # seconds of training before this process started
    best_score: Optional[float] = None
    best_update: int = 0
    metrics: List[Dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {"updates": self.updates, "tokens": self.tokens, "elapsed": self.elapsed,
                "best_score": self.best_score, "best_update": self.best_update,
                "metrics": self.metrics}


@dataclass
class TrainSummary:
    """What :meth:`Trainer.run` reports."""

    updates: int
    epochs: int
    tokens: int
    seconds: float
    tokens_per_s: float
    last_train_loss: float
    best_score: Optional[float]
    best_update: int
    metrics: List[Dict[str, Any]]


def _rng_state() -> Dict[str, Any]:
    """All global RNG states as tensors/plain types (loadable with weights_only=True)."""
    np_state = np.random.get_state()
    state: Dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached": float(np_state[4])},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = state["numpy"]
    np.random.set_state(("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["pos"],
                         numpy["has_gauss"], numpy["cached"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Trainer:
    """Trains one direction's model; see the module docstring for what a run does.

    model: freshly built (or base-frozen) model, any device; corpus: encoded training pairs;
    out_dir: the direction's folder in the model directory (None: write nothing, for tests);
    validation: optional held-out data.
    """

    def __init__(self, model: AlignmentModel, corpus: EncodedCorpus, direction: str,
                 config: TrainConfig, out_dir: Optional[str], device: torch.device,
                 context: Optional[DistributedContext] = None,
                 validation: Optional[Validation] = None, progress: bool = True,
                 progress_position: int = 0):
        check_condition(direction in C.DIRECTIONS, f"direction must be fwd or rev: {direction}")
        self.model = model.to(device)
        self.corpus = corpus
        self.direction = direction
        self.name = direction          # in log lines and the progress bar
        self.config = config
        self.out_dir = out_dir
        self.device = device
        self.context = context or DistributedContext()
        self.validation = validation
        self.progress = progress and self.context.is_main
        self.progress_position = progress_position
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        check_condition(bool(self.parameters), "the model has no trainable parameters")
        self.optimizer = torch.optim.Adam(self.parameters, lr=config.lr,
                                          betas=(config.adam_beta1, config.adam_beta2),
                                          eps=config.adam_eps, weight_decay=config.weight_decay)
        self.loss_module: nn.Module = _LossModule(model)
        if self.context.enabled:
            from torch.nn.parallel import DistributedDataParallel

            self.loss_module = DistributedDataParallel(
                self.loss_module, device_ids=[device.index] if device.type == "cuda" else None)
        self.batcher = TokenBatcher.from_corpus(corpus, config.max_tokens, seed=config.seed,
                                                shuffle=True, rank=self.context.rank,
                                                world_size=self.context.world_size)
        # decoder-side lengths (+EOS): the tokens each pair contributes to the loss
        decoder_lengths = corpus.tgt_lengths if direction == "fwd" else corpus.src_lengths
        self._decoder_tokens = decoder_lengths + 1
        self.guides = None
        if config.guide_weight > 0:
            from aligner.guide import GuideLinks

            self.guides = GuideLinks.open(corpus.directory, len(corpus))
            check_condition(self.guides is not None,
                            f"{corpus.directory}: the encoded corpus has no guide links "
                            f"(--guide-weight without --guide?)")
        self.state = TrainState()

    # -- files -----------------------------------------------------------------------------
    def _path(self, name: str) -> Optional[str]:
        return None if self.out_dir is None else os.path.join(self.out_dir, name)

    def _write_files(self) -> bool:
        return self.out_dir is not None and self.context.is_main

    def can_resume(self) -> bool:
        """Whether the direction folder holds a training state to continue from.

        Refuses (one line) a folder with trained weights but no training state: continuing
        would train from update 0 and replace those weights.
        """
        if self.out_dir is None:
            return False
        check_resumable(self.out_dir)
        return os.path.isfile(self._path(C.TRAINING_STATE))

    def save_checkpoint(self, improved: bool, elapsed: float) -> None:
        """params.last.pt (+ params.best.pt when improved), training_state.pt, metrics.tsv.

        elapsed: training seconds up to now, over all runs of this direction.
        """
        if not self._write_files():
            return
        os.makedirs(self.out_dir, exist_ok=True)
        self.save_weights(improved)
        state = {"trainer": {**self.state.to_dict(), "elapsed": elapsed},
                 "optimizer": self.optimizer.state_dict(),
                 "batcher": self.batcher.state_dict(), "rng": _rng_state(),
                 "direction": self.direction}
        save_checkpoint_file(state, self._path(C.TRAINING_STATE))
        with atomic_output(self._path(C.METRICS_NAME)) as out:
            out.write("\t".join(METRICS_COLUMNS) + "\n")
            for row in self.state.metrics:
                out.write("\t".join(_format_metric(row.get(k)) for k in METRICS_COLUMNS) + "\n")

    def save_weights(self, improved: bool) -> None:
        """params.last.pt (+ params.best.pt when improved) of the model."""
        save_params(self.model, self._path(C.PARAMS_LAST))
        if improved:
            save_params(self.model, self._path(C.PARAMS_BEST))

    def load_weights(self) -> None:
        """The weights to continue from: params.last.pt."""
        load_params(self.model, self._path(C.PARAMS_LAST))

    def load_checkpoint(self) -> None:
        """Continue from training_state.pt + params.last.pt of the direction folder."""
        state = load_checkpoint_file(self._path(C.TRAINING_STATE))
        self.load_weights()
        self.optimizer.load_state_dict(state["optimizer"])
        self.batcher.load_state_dict(state["batcher"])
        trainer = state["trainer"]
        self.state = TrainState(updates=trainer["updates"], tokens=trainer["tokens"],
                                elapsed=trainer["elapsed"], best_score=trainer["best_score"],
                                best_update=trainer["best_update"],
                                metrics=list(trainer["metrics"]))
        _set_rng_state(state["rng"])
        logger.info("[%s] resumed at update %d (epoch %d, batch %d)", self.name,
                    self.state.updates, self.batcher.epoch + 1, self.batcher.position)

    # -- the loop --------------------------------------------------------------------------
    def epochs_done(self) -> int:
        """Completed epochs (an epoch whose last batch was handed out counts as completed)."""
        return self.batcher.epoch + (1 if self.batcher.position >= len(self.batcher) else 0)

    def finished(self) -> bool:
        config = self.config
        return bool((config.max_updates and self.state.updates >= config.max_updates)
                    or (config.max_epochs and self.epochs_done() >= config.max_epochs))

    def _next_batches(self) -> List[List[int]]:
        """Up to update_freq batches for the next update; fewer (or none) at the epoch limit.

        An update may span two epochs; the batcher counts each batch as seen once handed out.
        """
        batches: List[List[int]] = []
        while len(batches) < self.config.update_freq:
            if self.config.max_epochs and self.epochs_done() >= self.config.max_epochs:
                break
            try:
                batches.append(next(self._iterator))
            except StopIteration:  # the epoch is over: the batcher has moved to the next one
                self._iterator = iter(self.batcher)
        return batches

    def _update(self, batches: Sequence[List[int]]) -> float:
        """One optimizer step on `batches`; returns this rank's loss sum (smoothed)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        tokens = torch.tensor(float(sum(self._decoder_tokens[i] for b in batches for i in b)))
        total_tokens = float(self.context.all_reduce_sum(tokens.clone()))
        scale = self.context.world_size / max(total_tokens, 1.0)
        loss_sum = 0.0
        for k, indices in enumerate(batches):
            batch = make_batch([self.corpus.source(i) for i in indices],
                               [self.corpus.target(i) for i in indices],
                               self.direction).to(self.device)
            sync = k == len(batches) - 1
            no_sync = getattr(self.loss_module, "no_sync", None)
            guide = {}
            if self.guides is not None:
                from aligner.guide import guide_matrix

                guide = {"guide": guide_matrix([self.guides.pair(i) for i in indices],
                                               self.direction, batch.tgt_out.size(1),
                                               batch.src.size(1)).to(self.device),
                         "guide_weight": self.config.guide_weight}
            with (no_sync() if (no_sync is not None and not sync) else contextlib.nullcontext()):
                with autocast_context(self.device):
                    loss, _ = self.loss_module(batch.src, batch.tgt_in, batch.tgt_out,
                                               self.config.label_smoothing, **guide)
                (loss * scale).backward()
            loss_sum += float(loss.detach())
        if self.config.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.parameters, self.config.clip_norm)
        self.state.updates += 1
        lr = learning_rate(self.config, self.state.updates)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.state.tokens += int(total_tokens)
        return loss_sum

    def validate(self) -> Dict[str, Optional[float]]:
        if self.validation is None:
            return {"valid_ppl": None, "valid_aer": None}
        return {"valid_ppl": self.validation.perplexity(self.model, self.direction, self.device),
                "valid_aer": self.validation.aer(self.model, self.direction, self.device)}

    def checkpoint(self, train_loss: float, tokens_per_s: float, elapsed: float) -> None:
        """Validate, decide best, record a metrics row, save."""
        scores = self.validate()
        score = scores["valid_aer"] if scores["valid_aer"] is not None else scores["valid_ppl"]
        improved = (score is None or self.state.best_score is None
                    or score < self.state.best_score)
        if improved:
            self.state.best_score, self.state.best_update = score, self.state.updates
        row = {"update": self.state.updates, "epoch": self.epochs_done(),
               "train_loss": train_loss, "train_ppl": math.exp(min(train_loss, 100.0)),
               "lr": learning_rate(self.config, max(self.state.updates, 1)),
               "tokens_per_s": tokens_per_s, "elapsed_s": elapsed, **scores}
        self.state.metrics.append(row)
        logger.info("[%s] checkpoint %d: train loss %.3f, valid ppl %s, valid AER %s%s",
                    self.name, self.state.updates, train_loss,
                    _format_metric(scores["valid_ppl"]),
                    "-" if scores["valid_aer"] is None else f"{100 * scores['valid_aer']:.1f}%",
                    " (best)" if improved else "")
        self.save_checkpoint(improved, elapsed)

    def run(self, resume: bool = False) -> TrainSummary:
        """Train until max_updates / max_epochs; returns a summary (rank 0 has written files)."""
        if resume and self.can_resume():
            self.load_checkpoint()
        config = self.config
        start, start_updates, start_tokens = time.time(), self.state.updates, self.state.tokens
        total = config.max_updates or config.max_epochs * math.ceil(
            len(self.batcher) / config.update_freq)
        bar = _progress_bar(total, self.state.updates, self.name, self.progress,
                            self.progress_position)
        # loss sums and token counts of this rank: since the last log line / checkpoint
        window = [0.0, 0.0]
        interval = [0.0, 0.0]
        self._iterator = iter(self.batcher)
        checkpointed_at = None
        while not self.finished():
            batches = self._next_batches()
            if not batches:
                break
            loss_sum = self._update(batches)
            local_tokens = float(sum(self._decoder_tokens[i] for b in batches for i in b))
            for sums in (window, interval):
                sums[0] += loss_sum
                sums[1] += local_tokens
            bar.update(1)
            if self.state.updates % config.log_interval == 0:
                loss = self._mean_loss(window)
                speed = (self.state.tokens - start_tokens) / max(time.time() - start, 1e-9)
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{speed:.0f}")
                logger.debug("[%s] update %d: loss %.3f, lr %.2e, %.0f tokens/s", self.name,
                             self.state.updates, loss, learning_rate(config, self.state.updates),
                             speed)
                window = [0.0, 0.0]
            if self.state.updates % config.checkpoint_interval == 0:
                speed = (self.state.tokens - start_tokens) / max(time.time() - start, 1e-9)
                self.checkpoint(self._mean_loss(interval), speed,
                                self.state.elapsed + time.time() - start)
                checkpointed_at = self.state.updates
                interval = [0.0, 0.0]
        bar.close()
        seconds = time.time() - start
        speed = (self.state.tokens - start_tokens) / max(seconds, 1e-9)
        if self.state.updates > start_updates and checkpointed_at != self.state.updates:
            self.checkpoint(self._mean_loss(interval), speed, self.state.elapsed + seconds)
        self.state.elapsed += seconds
        logger.info("[%s] done: %d updates (%d in this run) in %.1fs, %.0f target tokens/s; "
                    "best checkpoint at update %d", self.name, self.state.updates,
                    self.state.updates - start_updates, seconds, speed, self.state.best_update)
        last = self.state.metrics[-1]["train_loss"] if self.state.metrics else float("nan")
        return TrainSummary(updates=self.state.updates, epochs=self.epochs_done(),
                            tokens=self.state.tokens, seconds=seconds, tokens_per_s=speed,
                            last_train_loss=last, best_score=self.state.best_score,
                            best_update=self.state.best_update, metrics=self.state.metrics)

    def _mean_loss(self, sums: List[float]) -> float:
        """Loss per target token over all ranks from this rank's [loss sum, tokens]."""
        total = self.context.all_reduce_sum(torch.tensor(sums, dtype=torch.float64))
        return float(total[0] / total[1]) if float(total[1]) > 0 else float("nan")


def check_resumable(out_dir: str) -> None:
    """Refuse (one line) to resume a direction folder that has weights but no training state.

    Without ``training_state.pt`` a resumed direction would start again from update 0 and
    overwrite its trained ``params.*.pt``; only ``--overwrite`` may do that. A folder with
    neither (the run stopped before its first checkpoint) is fine: training starts afresh.
    """
    state = os.path.join(out_dir, C.TRAINING_STATE)
    weights = [name for name in (C.PARAMS_LAST, C.PARAMS_BEST)
               if os.path.isfile(os.path.join(out_dir, name))]
    check_condition(os.path.isfile(state) or not weights,
                    f"{state}: missing, but {weights[0] if weights else ''} beside it holds "
                    f"trained weights: --resume cannot continue this direction (use --overwrite "
                    f"to train a new model)")


def _format_metric(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def read_metrics(path: str) -> List[Dict[str, Any]]:
    """The rows of a ``metrics.tsv`` as the trainer wrote them (the twin of the writer in
    :meth:`Trainer.save_checkpoint` and :func:`_format_metric`), one per checkpoint, in order.

    Each row has the keys :data:`METRICS_COLUMNS`; ``-`` (no value, e.g. no validation) reads
    as None, ``update`` and ``epoch`` as int, every other column as float (``nan`` too; the
    writer keeps 6 significant digits). AlignerError naming file and line for a file that is
    not such a table (another header, a row with another number of cells, a cell that is not a
    number); OSError when it cannot be read.
    """
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    header = tuple(lines[0].split("\t")) if lines else ()
    check_condition(header == METRICS_COLUMNS,
                    f"{path}:1: not a {C.METRICS_NAME} of `align train` (columns "
                    f"{', '.join(header) or 'none'}; expected {', '.join(METRICS_COLUMNS)})")
    rows = []
    for line_no, line in enumerate(lines[1:], start=2):
        cells = line.split("\t")
        check_condition(len(cells) == len(METRICS_COLUMNS),
                        f"{path}:{line_no}: {len(cells)} cells, expected "
                        f"{len(METRICS_COLUMNS)} ({', '.join(METRICS_COLUMNS)})")
        row: Dict[str, Any] = {}
        for column, cell in zip(METRICS_COLUMNS, cells):
            try:
                row[column] = (None if cell == "-" else
                               int(cell) if column in ("update", "epoch") else float(cell))
            except ValueError:
                raise AlignerError(f"{path}:{line_no}: {column} is not a number "
                                   f"({cell!r})") from None
        rows.append(row)
    return rows


def _progress_bar(total: int, initial: int, direction: str, enabled: bool, position: int = 0):
    """A tqdm bar on stderr in row `position` (a do-nothing stand-in when disabled)."""
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=f"train {direction}", unit="upd",
                disable=not enabled, dynamic_ncols=True, leave=False, position=position)


# ---------------------------------------------------------------------------------------------
# One direction's training, in this process or in a process of its own
# ---------------------------------------------------------------------------------------------

@dataclass
class DirectionRun:
    """Everything training one direction needs beyond the files in `model_dir` (picklable, so
    that a --parallel-directions process can receive it).

    base_dir: the frozen base of a stage-2 run (alignment layer), else None; position: the row
    of this direction's progress bar when several are shown at once.
    """

    model_dir: str
    config: RunConfig
    direction: str
    resume: bool
    base_dir: Optional[str] = None
    validation: Optional[Validation] = None
    progress: bool = True
    position: int = 0


def train_direction(run: DirectionRun, device: torch.device,
                    context: Optional[DistributedContext] = None) -> TrainSummary:
    """Build the direction's model (seeded with the run's seed) and train it into
    MODEL_DIR/DIRECTION from the encoded corpus in MODEL_DIR/corpus."""
    from aligner.model_dir import build_direction_model, direction_dir, params_path

    context = context or DistributedContext()
    seed_everything(run.config.training.seed)
    model = build_direction_model(run.config, run.direction)
    if run.base_dir is not None:  # stage 2 starts from the trained base (frozen by load_base)
        base_weights = load_checkpoint_file(params_path(run.base_dir, run.direction, "best"))
        model.load_base(base_weights["state_dict"])
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
    except Exception:  # a bug: its traceback goes to the parent
        connection.send(("crash", traceback.format_exc()))
    finally:
        training = False
        connection.close()


def train_directions_in_parallel(runs: Sequence[DirectionRun], quiet: bool = False,
                                 verbose: bool = False) -> Dict[str, TrainSummary]:
    """Train each run's direction at the same time in its own ("spawn") process on the CPU.

    Each process gets ``torch.get_num_threads() // len(runs)`` threads (at least 1); with that
    many threads per direction the weights are the same as when the directions train one after
    the other (the directions share nothing but the read-only corpus). The first process to
    fail stops the others and its error is raised here; so does Ctrl-C (checkpoints are written
    atomically, so ``--resume`` continues from the last one of each direction).
    """
    import multiprocessing
    from multiprocessing.connection import wait

    threads = max(1, torch.get_num_threads() // len(runs))
    logger.info("training %s in parallel: %d processes with %d thread(s) each",
                ", ".join(run.direction for run in runs), len(runs), threads)
    context = multiprocessing.get_context("spawn")
    processes, waiting = [], {}
    summaries: Dict[str, TrainSummary] = {}
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
        for process in processes:  # each has sent its result: let it end on its own
            process.join()
    finally:  # after an error or Ctrl-C: stop the processes still training
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join()
    return {run.direction: summaries[run.direction] for run in runs}


# ---------------------------------------------------------------------------------------------
# A whole run: prepare the model directory, then train every direction
# ---------------------------------------------------------------------------------------------

def tokenize_bitext(pre: "Preprocessor", bitext: Bitext) -> Tuple[List[List[str]], List[List[str]]]:
    """Words of both sides after the preprocessor's tokenization/lowercasing (if any)."""
    if not (pre.config.tokenize or pre.config.lowercase):
        return bitext.source, bitext.target
    return ([pre.tokenize_line(" ".join(words), "src") for words in bitext.source],
            [pre.tokenize_line(" ".join(words), "tgt") for words in bitext.target])


#: in MODEL_DIR/corpus: which bitext the cached corpus was encoded from (see record_inputs)
INPUTS_NAME = "inputs.json"


def bitext_fingerprint(bitext: Bitext) -> str:
    """sha256 of the bitext's words, pair by pair (the same for the same text however its
    files are named, spaced or stored)."""
    digest = hashlib.sha256()
    for source, target in zip(bitext.source, bitext.target):
        digest.update(f"{' '.join(source)}\t{' '.join(target)}\n".encode("utf-8"))
    return digest.hexdigest()


def _bitext_names(bitext: Bitext) -> str:
    """'train.src + train.tgt', or the one file of a joint bitext."""
    if bitext.source_name == bitext.target_name:
        return bitext.source_name
    return f"{bitext.source_name} + {bitext.target_name}"


def record_inputs(model_dir: str, bitext: Bitext) -> None:
    """Write MODEL_DIR/corpus/inputs.json: the files, pair count and fingerprint of the bitext
    the cached corpus is encoded from (:func:`check_inputs` compares them on --resume)."""
    record = {"files": _bitext_names(bitext), "pairs": len(bitext),
              "sha256": bitext_fingerprint(bitext)}
    with atomic_output(os.path.join(model_dir, CORPUS_DIR, INPUTS_NAME)) as out:
        json.dump(record, out, indent=2, sort_keys=True)
        out.write("\n")


def check_inputs(model_dir: str, bitext: Bitext, ignore_change: bool = False) -> None:
    """On --resume: refuse (one line) when `bitext` is not the bitext the cached corpus of
    `model_dir` was encoded from, unless `ignore_change` (then training continues on the cached
    corpus and `bitext` is not used). A corpus without a record (written by an older version)
    cannot be checked: a warning says so."""
    path = os.path.join(model_dir, CORPUS_DIR, INPUTS_NAME)
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
        recorded = (str(record["files"]), int(record["pairs"]), str(record["sha256"]))
    except FileNotFoundError:
        logger.warning("%s: missing (written by an older version): cannot check that %s is the "
                       "data the cached corpus was built from", path, _bitext_names(bitext))
        return
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise AlignerError(f"{path}: not a record of the training data ({error})") from None
    files, pairs, fingerprint = recorded
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
                     data_config, bitext: Bitext) -> None:
    """Encode the training corpus into MODEL_DIR/corpus (with the record of the bitext it came
    from, `bitext`) and save prep, BPE and vocabularies."""
    from aligner.data import encode_corpus

    corpus_dir = os.path.join(model_dir, CORPUS_DIR)
    encode_corpus(pre, src_vocab, tgt_vocab, source, target, corpus_dir,
                  max_len=data_config.max_len, max_ratio=data_config.max_ratio)
    if data_config.guide:
        _encode_guide(pre, data_config.guide, source, target, corpus_dir)
    record_inputs(model_dir, bitext)
    pre.save(model_dir)
    src_vocab.save(os.path.join(model_dir, C.VOCAB_SRC))
    tgt_vocab.save(os.path.join(model_dir, C.VOCAB_TGT))


def _encode_guide(pre, path: str, source, target, corpus_dir: str) -> None:
    """Read the --guide file (Pharaoh word links of the training lines as training sees their
    words), check it against the bitext (one error line) and store its subword links beside
    the encoded corpus (aligner/guide.py)."""
    from aligner.formats import read_pharaoh
    from aligner.guide import check_guides, encode_guides

    alignments = read_pharaoh(path)
    check_guides(alignments, source, target, path)
    line_numbers = EncodedCorpus.open(corpus_dir).line_numbers
    n_links = encode_guides(pre, alignments, source, target, line_numbers, corpus_dir)
    logger.info("guide %s: %d word links, %d subword links over %d training pairs", path,
                sum(map(len, alignments)), n_links, len(line_numbers))


def _prepare_data(model_dir: str, bitext: Bitext, prep_config: "PrepConfig",
                  data_config: DataConfig, seed: int
                  ) -> Tuple["Preprocessor", Vocabulary, Vocabulary]:
    """Learn BPE, build vocabularies, encode the corpus into MODEL_DIR/corpus (rank 0 only)."""
    from aligner.prep import Preprocessor

    start = time.time()
    source, target = tokenize_bitext(Preprocessor(prep_config), bitext)
    pre = Preprocessor.learn(prep_config, source, target, seed=seed)
    src_vocab = Vocabulary.build(pre.segment(words, "src").subwords for words in source if words)
    tgt_vocab = Vocabulary.build(pre.segment(words, "tgt").subwords for words in target if words)
    logger.info("vocabularies: %d source and %d target subwords (with 4 specials)",
                len(src_vocab), len(tgt_vocab))
    _encode_and_save(pre, src_vocab, tgt_vocab, source, target, model_dir, data_config,
                     bitext)
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
    return hasattr(model_class(model_kind), "training_terms")


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
                    progress: bool = True) -> TrainSummary:
    """Build both directions' models (seeded) and train them together with the agreement term
    (aligner/agreement.py) from the encoded corpus in MODEL_DIR/corpus."""
    from aligner.agreement import AgreementPair, AgreementTrainer
    from aligner.model_dir import build_direction_model

    context = context or DistributedContext()
    seed_everything(config.training.seed)
    models = {direction: build_direction_model(config, direction)
              for direction in C.DIRECTIONS}
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
    """Whether `model_kind`'s loss takes a guide (aligner/guide.py)."""
    import inspect

    return "guide" in inspect.signature(model_class(model_kind).loss).parameters


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
                    directions: Sequence[str] = C.DIRECTIONS,
                    valid_bitext: Optional[Bitext] = None,
                    valid_gold: Optional[List[GoldAlignment]] = None,
                    resume: bool = False, overwrite: bool = False, quiet: bool = False,
                    verbose: bool = False, argv: Sequence[str] = (),
                    extra: Optional[Dict[str, Any]] = None,
                    base_dir: Optional[str] = None,
                    parallel_directions: bool = False,
                    ignore_data_change: bool = False) -> Dict[str, TrainSummary]:
    """`align train`: prepare `model_dir` and train `model_kind` in every direction.

    model_options: the model config without vocabulary sizes (those come from the data).
    valid_bitext / valid_gold: optional validation pairs (words as in `bitext`) and their
    gold alignments. Under torchrun every rank calls this; rank 0 prepares and writes.
    Returns the training summary per direction.

    The model options and validation method are checked before anything is written. With
    `resume`, `bitext` must be the bitext the cached corpus was encoded from (unless
    `ignore_data_change`: training continues on the cached corpus, see :func:`check_inputs`),
    and no direction may have weights without a training state (:func:`check_resumable`).

    parallel_directions (CPU only, not under torchrun): train the directions at the same time,
    each in its own process with an equal share of torch's threads (see
    :func:`train_directions_in_parallel`); otherwise one after the other.

    Model kinds trained on a frozen base (a class attribute ``BASE_KIND``, e.g. the
    alignment layer on a transformer) train in two stages: stage 1 is an ordinary run of
    ``BASE_KIND`` into ``MODEL_DIR/base`` (skipped when `base_dir` names a trained model
    directory of that kind, ``align train --base``); stage 2 reuses the base's preprocessing
    and vocabularies, copies the base's weights into the new model (``load_base``) and trains
    what is not frozen. Model size comes from the base; of `model_options` only the kind's own
    options (``split_options``) apply in stage 2.
    """
    from aligner.data import encode_pair
    from aligner.distributed import init_distributed, resolve_device, shutdown_distributed
    from aligner.log import log_run_info, setup_logging
    from aligner.model_dir import (acquire_lock, config_path, direction_dir, prepare_output_dir,
                                   release_lock, write_version)

    base_kind = model_class(model_kind).BASE_KIND
    check_condition(base_dir is None or base_kind is not None,
                    f"--base is only for model kinds trained on a frozen base, not '{model_kind}'")
    check_model_options(model_kind, model_options, train_config.valid_method)
    check_condition(not data_config.guide or supports_guide(model_kind),
                    f"--guide: guided alignment training is implemented for the direct HMMs "
                    f"(hmm0, hmm1), not '{model_kind}'")
    check_condition(train_config.guide_weight == 0 or bool(data_config.guide),
                    "--guide-weight needs --guide")
    agreement = train_config.agreement_weight > 0
    if agreement:
        check_agreement_options(model_kind, directions, parallel_directions)
    if base_kind is not None:
        model_options, base_dir, resume = _base_stage(
            model_dir, bitext, model_kind, model_options, prep_config, data_config, train_config,
            directions, valid_bitext, valid_gold, resume, overwrite, quiet, verbose, argv, base_dir,
            parallel_directions, ignore_data_change)
        extra = {**(extra or {}), "base": os.path.abspath(base_dir)}
    context = init_distributed(train_config.device)
    device = resolve_device(train_config.device, context.local_rank)
    resumed = resume
    lock = None
    try:
        if context.is_main:
            check_condition(not os.path.exists(model_dir) or os.path.isdir(model_dir),
                            f"{model_dir}: exists and is not a directory")
            os.makedirs(model_dir, exist_ok=True)
            lock = acquire_lock(model_dir)  # before anything is removed or written
            resumed = prepare_output_dir(model_dir, resume, overwrite)
            if resumed:  # before anything is trained: the cached corpus, every direction
                check_inputs(model_dir, bitext, ignore_data_change)
                if agreement:
                    from aligner.agreement import check_agreement_resumable

                    check_agreement_resumable(model_dir)
                else:
                    for direction in directions:
                        check_resumable(direction_dir(model_dir, direction))
        context.barrier()
        logfile = os.path.join(model_dir, C.LOG_NAME) if context.is_main else None
        log = setup_logging(quiet=quiet, verbose=verbose, console=context.is_main,
                            logfile=logfile)
        if context.is_main:
            log_run_info(log, argv)
            logger.info("device %s, %d process(es); %d training pairs", device,
                        context.world_size, len(bitext))
        if resumed:
            saved = RunConfig.load(config_path(model_dir))
            pre, src_vocab, tgt_vocab = load_preprocessing(model_dir)
        elif context.is_main and base_dir is not None:
            pre, src_vocab, tgt_vocab = _prepare_from_base(model_dir, base_dir, bitext,
                                                           data_config)
        elif context.is_main:
            pre, src_vocab, tgt_vocab = _prepare_data(model_dir, bitext, prep_config,
                                                      data_config, train_config.seed)
        context.barrier()
        if not resumed and not context.is_main:
            pre, src_vocab, tgt_vocab = load_preprocessing(model_dir)
        models = direction_model_configs(model_options, directions, len(src_vocab),
                                         len(tgt_vocab))
        if base_dir is not None:  # stage 2: the base's model configs plus the kind's own options
            base_config = RunConfig.load(config_path(base_dir))
            models = {d: {**base_config.models[d], **model_options} for d in directions}
            prep_config = pre.config
        config = RunConfig(model_kind=model_kind, directions=list(directions), models=models,
                           prep=prep_config.to_dict(), data=data_config, training=train_config,
                           extra=dict(extra or {}))
        if resumed:
            differences = saved.differences(config)
            check_condition(not differences,
                            f"{model_dir}: cannot resume, these settings differ from the saved "
                            f"run: {', '.join(differences)} (use --overwrite to start a new run)")
        if context.is_main:
            config.save(config_path(model_dir))
            write_version(model_dir)
        validation = None
        if valid_bitext is not None:
            source, target = tokenize_bitext(pre, valid_bitext)
            validation = Validation([encode_pair(pre, src_vocab, tgt_vocab, s, t)
                                     for s, t in zip(source, target)], valid_gold,
                                    train_config.valid_method)
        runs = [DirectionRun(model_dir, config, direction, resumed, base_dir, validation,
                             progress=not quiet, position=position)
                for position, direction in enumerate(directions)]
        if agreement:
            summary = train_agreement(model_dir, config, resumed, device, context, validation,
                                      progress=not quiet)
            summaries = {direction: summary for direction in directions}
        elif parallel_directions and len(runs) > 1:
            check_condition(not context.enabled,
                            "--parallel-directions cannot be combined with torchrun (DDP trains "
                            "one direction at a time on all processes)")
            check_condition(device.type == "cpu",
                            f"--parallel-directions trains each direction in its own CPU "
                            f"process; on {device} train them one after the other (the default)")
            summaries = train_directions_in_parallel(runs, quiet=quiet, verbose=verbose)
        else:
            summaries = {run.direction: train_direction(run, device, context) for run in runs}
        context.barrier()
    finally:
        if lock is not None:
            release_lock(lock)
    shutdown_distributed(context)
    return summaries


def _base_stage(model_dir: str, bitext: Bitext, model_kind: str, model_options: Dict[str, Any],
                prep_config: "PrepConfig", data_config: DataConfig, train_config: TrainConfig,
                directions: Sequence[str], valid_bitext: Optional[Bitext],
                valid_gold: Optional[List[GoldAlignment]], resume: bool, overwrite: bool,
                quiet: bool, verbose: bool, argv: Sequence[str], base_dir: Optional[str],
                parallel_directions: bool = False, ignore_data_change: bool = False
                ) -> Tuple[Dict[str, Any], str, bool]:
    """Stage 1 of a kind trained on a frozen base: train the base (unless `base_dir` is given),
    check it. Returns (the kind's own model options, base directory, resume flag of stage 2)."""
    import dataclasses

    from aligner.model_dir import BASE_DIR, config_path

    cls = model_class(model_kind)
    base_kind = cls.BASE_KIND
    base_options, own_options = cls.split_options(model_options)
    if base_dir is None:
        base_dir = os.path.join(model_dir, BASE_DIR)
        base_methods = model_class(base_kind).METHODS
        stage1 = train_config
        if train_config.valid_method and train_config.valid_method not in base_methods:
            stage1 = dataclasses.replace(train_config, valid_method="")
        logger.info("stage 1: training the %s base into %s", base_kind, base_dir)
        train_model_dir(base_dir, bitext, base_kind, base_options, prep_config, data_config,
                        stage1, directions, valid_bitext, valid_gold, resume=resume,
                        overwrite=overwrite, quiet=quiet, verbose=verbose, argv=argv,
                        parallel_directions=parallel_directions,
                        ignore_data_change=ignore_data_change)
        # stage 2 resumes only when it had started (it writes config.json first)
        resume = resume and os.path.isfile(config_path(model_dir))
    check_condition(os.path.isfile(config_path(base_dir)),
                    f"{base_dir}: not a model directory ({C.CONFIG_NAME} is missing)")
    base_config = RunConfig.load(config_path(base_dir))
    check_condition(base_config.model_kind == base_kind,
                    f"{base_dir}: the base of '{model_kind}' must be a '{base_kind}' model "
                    f"directory, this one holds '{base_config.model_kind}'")
    missing = [d for d in directions if d not in base_config.directions]
    check_condition(not missing, f"{base_dir}: the base has no {', '.join(missing)} model")
    return own_options, base_dir, resume


def _prepare_from_base(model_dir: str, base_dir: str, bitext: Bitext, data_config: DataConfig
                       ) -> Tuple["Preprocessor", Vocabulary, Vocabulary]:
    """Stage 2: the base's preprocessing and vocabularies (copied into `model_dir`) and the
    training corpus encoded with them into MODEL_DIR/corpus (rank 0 only)."""
    pre, src_vocab, tgt_vocab = load_preprocessing(base_dir)
    source, target = tokenize_bitext(pre, bitext)
    _encode_and_save(pre, src_vocab, tgt_vocab, source, target, model_dir, data_config,
                     bitext)
    logger.info("preprocessing and vocabularies of the base %s", base_dir)
    return pre, src_vocab, tgt_vocab
