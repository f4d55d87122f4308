"""The training loop, generic over :class:`aligner.models.base.AlignmentModel`.

One :class:`Trainer` trains one direction's model on an encoded corpus:

* only parameters with ``requires_grad`` are optimized (a model kind can freeze a base network
  and train a new part with the same loop);
* Adam with linear warm-up, then inverse-square-root or linear decay; gradient clipping; gradient
  accumulation over ``update_freq`` batches; the loss of an update is the sum over its tokens
  divided by the number of tokens of the whole update (all batches, all ranks);
* a checkpoint every ``checkpoint_interval`` updates and at the end: validation (perplexity and,
  with a gold set, AER), ``params.last.pt``, ``params.best.pt`` when validation improved (lower
  AER; without gold, lower perplexity; without validation data, every checkpoint is the best),
  ``training_state.pt`` and ``metrics.tsv``;
* resuming from ``training_state.pt`` continues with exactly the batches, RNG states,
  optimizer state and counters of the interrupted run, so N updates in one go and N/2 + resume
  + N/2 give bit-identical parameters (on CPU; on CUDA with ``deterministic``);
* DDP under torchrun: gradients are averaged over ranks, every rank takes its own shard of each
  epoch's batches, only rank 0 writes files and logs to the console;
* ``config.deterministic``: deterministic kernels (:func:`use_deterministic_algorithms`),
  for bit-identical runs on a GPU (the CPU is deterministic without it);
* ``config.precision`` (aligner/precision.py): the forward pass and the loss run under bf16
  autocast with ``bf16``, and with ``auto`` on a CUDA device with native bfloat16 (parameters,
  gradients and optimizer state stay fp32); fp32 otherwise, on the CPU unless asked.

A whole ``align train`` run around it (the model directory, its data, every direction) is
aligner/training/run.py.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from aligner import constants as C
from aligner import faults
from aligner.config import TrainConfig
from aligner.data import Batch, EncodedCorpus, EncodedPair, TokenBatcher, make_batch
from aligner.distributed import DistributedContext
from aligner.extract.inference import align_pairs, pair_batches
from aligner.formats import GoldAlignment
from aligner.links.metrics import score_aer
from aligner.model_dir import (load_checkpoint_file, load_params, load_weights_state,
                               save_checkpoint_file, save_params, weights_state)
from aligner.models.base import AlignmentModel
from aligner.precision import autocast_context, resolve_precision
from aligner.training.guidance import (GuideLinks, guide_cross_entropy, guide_matrix,
                                       unaligned_to_eos)
from aligner.utils import AlignerError, atomic_output, check_condition

logger = logging.getLogger(__name__)

METRICS_COLUMNS = ("update", "epoch", "train_loss", "train_ppl", "valid_ppl", "valid_aer", "lr",
                   "tokens_per_s", "elapsed_s")


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's (CPU and CUDA) global generators."""
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


#: cuBLAS's deterministic workspace setting (CUDA's documentation: results of cuBLAS calls
#: are reproducible with ":4096:8" or ":16:8"); torch refuses cuBLAS calls under
#: use_deterministic_algorithms without one
CUBLAS_WORKSPACE = ":4096:8"


def use_deterministic_algorithms(enabled: bool) -> None:
    """``--deterministic``: torch.use_deterministic_algorithms(True) and, unless the
    environment sets it, CUBLAS_WORKSPACE_CONFIG=:4096:8 — best before CUDA starts (cuBLAS
    reads it when it creates its handle): the commands call this first. Nothing when not
    `enabled` (a setting made by the caller stays).

    On a GPU every kernel the trainers use then has a deterministic implementation (torch's
    list: scatter_add_, index_add, index_put, gather and index_select backward, embedding
    backward, cuBLAS with the workspace setting) or raises (none known here), so a run and
    its resumed twin give the same bits. On the CPU the kernels are deterministic anyway:
    the output is the same with and without it.
    """
    if not enabled:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`. To a GPU through pinned memory without blocking: a plain
    ``.to("cuda")`` of pageable memory waits until the GPU has finished all work queued before
    it (the previous update), a host sync per batch; the copy from pinned memory is queued on
    the stream like a kernel (the caching host allocator keeps the pinned block until the copy
    is done). Elsewhere ``.to(device)`` (on the CPU the tensor itself)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def learning_rate(config: TrainConfig, update: int, total_updates: int = 0) -> float:
    """Learning rate of update number `update` (1-based) of a run of `total_updates` updates.

    Linear warm-up over config.warmup updates to config.lr, then config.lr_schedule:
    "inverse-sqrt" decays as lr·sqrt(w/u) (total_updates unused); "linear" decays as
    lr·(T - u + 1)/(T - w + 1) with T = total_updates, from lr at u = w to lr/(T - w + 1) at
    the last update u = T (never 0: every update still moves the weights; w = 1 when there is
    no warm-up, so that update 1 has the full lr): fairseq's polynomial_decay with power 1,
    but ending at lr/(T - w + 1) instead of 0. With warmup >= T the run never leaves the
    warm-up.
    """
    warm = update / config.warmup if config.warmup else 1.0
    if config.lr_schedule == "linear":
        check_condition(total_updates > 0, "the linear learning-rate schedule needs the run's "
                                           "number of updates")
        decay = (total_updates - update + 1) / max(total_updates - max(config.warmup, 1) + 1, 1)
        return config.lr * max(min(warm, decay), 0.0)
    if config.warmup == 0:
        return config.lr
    return config.lr * min(warm, math.sqrt(config.warmup / update))


def guided_loss(model: AlignmentModel, src: torch.Tensor, tgt_in: torch.Tensor,
                tgt_out: torch.Tensor, label_smoothing: float, guide: torch.Tensor,
                guide_weight: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """(NLL + guide_weight · CE(guide, posterior), target tokens): the loss of guided
    alignment training (aligner/training/guidance.py), summed over the batch like ``model.loss``.

    Made of what the model contract declares for it: the NLL and the differentiable log
    posterior (B, I+1, J+1) of :meth:`~aligner.models.base.AlignmentModel.training_terms`
    (kinds with ``TRAINS_POSTERIOR``); guide (B, I+1, J+1) in the same orientation, rows
    summing to 1 or 0 (:func:`aligner.training.guidance.guide_matrix`); a kind with
    ``GUIDE_UNALIGNED_TO_EOS`` gets its zero rows sent to EOS first (``unaligned_to_eos``).
    """
    if model.GUIDE_UNALIGNED_TO_EOS:
        guide = unaligned_to_eos(guide, src, tgt_out)
    nll, tokens, log_posterior = model.training_terms(src, tgt_in, tgt_out, label_smoothing,
                                                      posterior=True)
    return nll + guide_weight * guide_cross_entropy(log_posterior, guide), tokens


class _LossModule(nn.Module):
    """A model's training loss as ``forward``, so that DistributedDataParallel can hook it:
    ``model.loss``, or :func:`guided_loss` given a guide."""

    def __init__(self, model: AlignmentModel):
        super().__init__()
        self.model = model

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                label_smoothing: float, guide: Optional[torch.Tensor] = None,
                guide_weight: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
        """``guide`` (B, I+1, J+1), ``guide_weight``: see :func:`guided_loss`."""
        if guide is not None and guide_weight > 0.0:
            return guided_loss(self.model, src, tgt_in, tgt_out, label_smoothing, guide,
                               guide_weight)
        return self.model.loss(src, tgt_in, tgt_out, label_smoothing=label_smoothing)


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
    def perplexity(self, model: AlignmentModel, direction: str, device: torch.device,
                   precision: str = "auto") -> float:
        """exp(mean NLL per target token, EOS included), no label smoothing, eval mode, in
        the training's `precision`."""
        model.eval()
        total, tokens, batches = 0.0, 0, 0
        for _, batch in pair_batches(model, self.pairs, direction, self.max_tokens, device):
            with autocast_context(precision, device):
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


def _rng_state(device: torch.device) -> Dict[str, Any]:
    """All global RNG states as tensors/plain types (loadable with weights_only=True); the CUDA
    generators' (one per visible GPU) only when training on CUDA: reading them initializes
    CUDA, which a CPU run (and each of its --parallel-directions processes) must not do."""
    np_state = np.random.get_state()
    state: Dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached": float(np_state[4])},
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restorable_cuda_states(saved: Sequence[torch.Tensor], device_count: int
                           ) -> List[torch.Tensor]:
    """The saved CUDA generator states that GPUs 0 .. device_count-1 take back: GPU k gets
    state k, as saved; with fewer GPUs visible than at save time the extra states are dropped,
    with more the extra GPUs keep their seeded state."""
    return list(saved[:device_count])


def _set_rng_state(state: Dict[str, Any], device: torch.device) -> None:
    """Restore :func:`_rng_state`'s states. CUDA generators only when training on CUDA (a
    checkpoint of a GPU run resumes on the CPU without touching CUDA), as many as fit the GPUs
    visible now (a log line says when that is not all of them)."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = state["numpy"]
    np.random.set_state(("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["pos"],
                         numpy["has_gauss"], numpy["cached"]))
    saved = state.get("cuda") or []
    if device.type != "cuda":
        if saved:
            logger.info("%d saved CUDA RNG state(s) not restored: training on %s", len(saved),
                        device)
        return
    count = torch.cuda.device_count()
    restored = restorable_cuda_states(saved, count)
    for index, generator_state in enumerate(restored):
        torch.cuda.set_rng_state(generator_state, index)
    if len(saved) != count:
        logger.info("restored %d of %d saved CUDA RNG state(s) on %d visible GPU(s)",
                    len(restored), len(saved), count)


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
        #: fp32 or bf16: config.precision resolved for `device` (aligner/precision.py)
        self.precision = resolve_precision(config.precision, device)
        self.context = context or DistributedContext()
        self.validation = validation
        self.progress = progress and self.context.is_main
        self.progress_position = progress_position
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        check_condition(bool(self.parameters), "the model has no trainable parameters")
        self.optimizer = torch.optim.Adam(self.parameters, lr=config.lr,
                                          betas=(config.adam_beta1, config.adam_beta2),
                                          eps=config.adam_eps, weight_decay=config.weight_decay)
        self.loss_module: nn.Module = self.make_loss_module(model)
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
            self.guides = GuideLinks.open(corpus.directory, len(corpus))
            check_condition(self.guides is not None,
                            f"{corpus.directory}: the encoded corpus has no guide links "
                            f"(--guide-weight without --guide?)")
        self.state = TrainState()
        # updates of the whole run (this rank's batches; the progress bar's total and the
        # linear learning-rate schedule's end): max_updates or max_epochs, whichever limit is
        # reached first; an update may take batches of two epochs (_next_batches)
        by_epochs = math.ceil(config.max_epochs * len(self.batcher) / config.update_freq)
        self.total_updates = min(n for n in (config.max_updates, by_epochs) if n > 0)

    def make_loss_module(self, model: AlignmentModel) -> nn.Module:
        """The module whose ``forward(src, tgt_in, tgt_out, label_smoothing, guide=None,
        guide_weight=0.0)`` gives a batch's (loss sum, tokens): :class:`_LossModule` of the
        model. Refuses (one line) a guided run of a kind whose contract gives no alignment
        posterior (``TRAINS_POSTERIOR`` False)."""
        check_condition(self.config.guide_weight == 0 or model.TRAINS_POSTERIOR,
                        f"guided alignment training needs the model's alignment posterior: "
                        f"{type(model).__name__} does not provide it (TRAINS_POSTERIOR is "
                        f"False)")
        return _LossModule(model)

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

        training_state.pt holds the weights it belongs to as well (``"weights"``): the state
        file is the checkpoint, and it is written first, so that a run cut off (a full disk, a
        kill) between the files resumes from weights and optimizer state of one and the same
        update, its own. Written before params.*.pt, the first checkpoint is as resumable as
        the later ones: a direction folder never holds weights without a training state (which
        :func:`check_resumable` refuses), only a state with the previous checkpoint's weights
        files, or nothing (the direction starts afresh).
        """
        if not self._write_files():
            return
        self._check_finite_weights()
        os.makedirs(self.out_dir, exist_ok=True)
        state = {"trainer": {**self.state.to_dict(), "elapsed": elapsed},
                 "optimizer": self.optimizer.state_dict(),
                 "batcher": self.batcher.state_dict(), "rng": _rng_state(self.device),
                 "direction": self.direction,
                 "weights": {name: weights_state(model)
                             for name, model in self.weight_models().items()}}
        save_checkpoint_file(state, self._path(C.TRAINING_STATE))
        del state
        self.save_weights(improved)
        with atomic_output(self._path(C.METRICS_NAME)) as out:
            out.write("\t".join(METRICS_COLUMNS) + "\n")
            for row in self.state.metrics:
                out.write("\t".join(_format_metric(row.get(k)) for k in METRICS_COLUMNS) + "\n")
        faults.reached("checkpoint")

    def weight_models(self) -> Dict[str, AlignmentModel]:
        """The models whose weights a checkpoint holds, by name (here: the direction's)."""
        return {self.direction: self.model}

    def _check_finite_weights(self) -> None:
        """Refuse (one line) to write a checkpoint of non-finite weights: the last good one
        stays."""
        for name, model in self.weight_models().items():
            bad = [key for key, value in model.state_dict().items()
                   if value.is_floating_point() and not bool(torch.isfinite(value).all())]
            if bad:
                raise AlignerError(f"[{self.name}] update {self.state.updates}: the {name} "
                                   f"weights are not finite ({bad[0]}): the learning rate or a "
                                   f"loss weight is too large. The last checkpoint stays as "
                                   f"it was")

    def save_weights(self, improved: bool) -> None:
        """params.last.pt (+ params.best.pt when improved) of the model."""
        save_params(self.model, self._path(C.PARAMS_LAST))
        if improved:
            save_params(self.model, self._path(C.PARAMS_BEST))

    def load_weights(self) -> None:
        """The weights to continue from: params.last.pt (a training state written before
        states held their weights)."""
        load_params(self.model, self._path(C.PARAMS_LAST))

    def load_checkpoint(self) -> None:
        """Continue from training_state.pt: its weights (older states: params.last.pt),
        optimizer, batcher position, counters and RNG states."""
        path = self._path(C.TRAINING_STATE)
        state = load_checkpoint_file(path)
        if "weights" in state:
            models = self.weight_models()
            check_condition(set(state["weights"]) == set(models),
                            f"{path}: holds the weights of {', '.join(sorted(state['weights']))}"
                            f", this run trains {', '.join(sorted(models))}")
            for name, model in models.items():
                load_weights_state(model, state["weights"][name], path)
        else:
            self.load_weights()
        self.optimizer.load_state_dict(state["optimizer"])
        self.batcher.load_state_dict(state["batcher"])
        trainer = state["trainer"]
        self.state = TrainState(updates=trainer["updates"], tokens=trainer["tokens"],
                                elapsed=trainer["elapsed"], best_score=trainer["best_score"],
                                best_update=trainer["best_update"],
                                metrics=list(trainer["metrics"]))
        _set_rng_state(state["rng"], self.device)
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

    def _next_update(self) -> Tuple[List[List[int]], int]:
        """Up to update_freq batches for the next update (fewer, or none, at the epoch limit),
        and the decoder tokens of the update over all ranks.

        An update may span two epochs; the batcher counts each batch as seen once handed out.
        The count of all ranks comes from the batcher (every rank knows every rank's batch of
        the same slot, :meth:`TokenBatcher.slot_batches`), not from a collective: under DDP an
        all-reduce per update would make every update wait for the host and the other ranks.
        """
        batches: List[List[int]] = []
        tokens = 0
        while len(batches) < self.config.update_freq:
            if self.config.max_epochs and self.epochs_done() >= self.config.max_epochs:
                break
            try:
                batches.append(next(self._iterator))
            except StopIteration:  # the epoch is over: the batcher has moved to the next one
                self._iterator = iter(self.batcher)
                continue
            # the batch just handed out is number position - 1 of the batcher's epoch
            for batch in self.batcher.slot_batches(self.batcher.epoch, self.batcher.position - 1):
                tokens += self._batch_tokens(batch)
        return batches, tokens

    def _batch_tokens(self, indices: Sequence[int]) -> int:
        """Decoder tokens (EOS included) of the pairs `indices`: the tokens of their loss."""
        return int(sum(self._decoder_tokens[i] for i in indices))

    def _update(self, batches: Sequence[List[int]],
                total_tokens: Optional[int] = None) -> torch.Tensor:
        """One optimizer step on `batches`; returns this rank's loss sum (smoothed), a float64
        scalar on the device: summed there, it is read on the host only at log and checkpoint
        intervals (float() after every batch waited for the GPU to finish each update).
        float64 additions of the float32 losses in the same order as Python's float sums,
        so the logged losses are the same bits as before.

        total_tokens: the decoder tokens of the update over all ranks (:meth:`_next_update`
        counts them on the host); None: this rank's tokens of `batches` summed over the ranks
        by an all-reduce (for callers with batches of their own). The loss is divided by it
        (times world_size: DDP averages the ranks' gradients), the same number either way.
        """
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        if total_tokens is None:
            tokens = torch.tensor(float(sum(self._batch_tokens(b) for b in batches)))
            total_tokens = int(self.context.all_reduce_sum(tokens.clone()))
        scale = self.context.world_size / max(float(total_tokens), 1.0)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for k, indices in enumerate(batches):
            batch = make_batch([self.corpus.source(i) for i in indices],
                               [self.corpus.target(i) for i in indices], self.direction)
            batch = Batch(*(to_device(t, self.device)
                            for t in (batch.src, batch.tgt_in, batch.tgt_out)))
            sync = k == len(batches) - 1
            no_sync = getattr(self.loss_module, "no_sync", None)
            guide = {}
            if self.guides is not None:
                matrix = guide_matrix([self.guides.pair(i) for i in indices], self.direction,
                                      batch.tgt_out.size(1), batch.src.size(1))
                guide = {"guide": to_device(matrix, self.device),
                         "guide_weight": self.config.guide_weight}
            with (no_sync() if (no_sync is not None and not sync) else contextlib.nullcontext()):
                with autocast_context(self.precision, self.device):
                    loss, _ = self.loss_module(batch.src, batch.tgt_in, batch.tgt_out,
                                               self.config.label_smoothing, **guide)
                (loss * scale).backward()
            loss_sum = loss_sum + loss.detach().double()
        if self.config.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.parameters, self.config.clip_norm)
        self.state.updates += 1
        lr = learning_rate(self.config, self.state.updates, self.total_updates)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.state.tokens += int(total_tokens)
        return loss_sum

    def validate(self) -> Dict[str, Optional[float]]:
        if self.validation is None:
            return {"valid_ppl": None, "valid_aer": None}
        return {"valid_ppl": self.validation.perplexity(self.model, self.direction, self.device,
                                                        self.precision),
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
               "lr": learning_rate(self.config, max(self.state.updates, 1), self.total_updates),
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
        bar = _progress_bar(self.total_updates, self.state.updates, self.name, self.progress,
                            self.progress_position)
        # loss sums (float64 scalars on the device) and token counts of this rank: since the
        # last log line / checkpoint
        window: List[Any] = [0.0, 0.0]
        interval: List[Any] = [0.0, 0.0]
        self._iterator = iter(self.batcher)
        checkpointed_at = None
        while not self.finished():
            batches, total_tokens = self._next_update()
            if not batches:
                break
            loss_sum = self._update(batches, total_tokens)
            local_tokens = float(sum(self._batch_tokens(b) for b in batches))
            for sums in (window, interval):
                sums[0] += loss_sum
                sums[1] += local_tokens
            bar.update(1)
            if self.state.updates % config.log_interval == 0:
                loss = self._mean_loss(window)
                speed = (self.state.tokens - start_tokens) / max(time.time() - start, 1e-9)
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{speed:.0f}")
                logger.debug("[%s] update %d: loss %.3f, lr %.2e, %.0f tokens/s", self.name,
                             self.state.updates, loss,
                             learning_rate(config, self.state.updates, self.total_updates),
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

    def _last_checkpoint(self) -> int:
        """The update of the last checkpoint written (0: none)."""
        return int(self.state.metrics[-1]["update"]) if self.state.metrics else 0

    def _mean_loss(self, sums: List[Any]) -> float:
        """Loss per target token over all ranks from this rank's [loss sum (a float or a
        float64 scalar tensor on the device), tokens]: the one host sync of the loss. A
        non-finite loss stops training (one line naming the update; the last checkpoint
        stays as it was)."""
        loss_sum = torch.as_tensor(sums[0], dtype=torch.float64).cpu()
        total = self.context.all_reduce_sum(
            torch.stack([loss_sum, torch.tensor(sums[1], dtype=torch.float64)]))
        if float(total[1]) > 0 and not math.isfinite(float(total[0])):
            raise AlignerError(f"[{self.name}] update {self.state.updates}: the training loss "
                               f"is {float(total[0])} (not finite): the learning rate or a "
                               f"loss weight is too large. The last checkpoint (update "
                               f"{self._last_checkpoint()}) stays as it was")
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
