"""Agreement training: both directions in one step, pulled towards the same alignment.

Liang, Taskar & Klein 2006, *Alignment by Agreement*. On one batch of pairs
the forward model (source → target) and the reverse model (target → source) are trained
together with

    loss = NLL_fwd + NLL_rev + λ · Σ_b Σ_{i<I_b} Σ_{j<J_b} (γ_fwd[b, i, j] − γ_rev[b, j, i])²

γ_fwd (B, I+1, J+1): the forward model's alignment posterior of target position i over source
positions j (the distribution ``hmm-posterior`` extracts); γ_rev (B, J+1, I+1) the reverse
model's, source position over target positions. Both directions share one segmentation, so the
subword posteriors compare directly; the EOS row/column (the HMMs' "NULL") and padding take no
part in the disagreement. The gradient reaches both models: each is pulled towards the other.

Why the squared distance rather than Liang's −log Σ γ_fwd·γ_revᵀ: every term is bounded (by 1
per subword pair), so the penalty is on the scale of the NLL (one term per token) whatever the
sentence length, and its gradient stays finite where the two posteriors are disjoint (a word one
direction sends to EOS), where the log of the product would blow up.

Both terms are built from what the model contract declares (aligner/models/base.py): each
direction's NLL and posterior come from its ``training_terms`` (``TRAINS_POSTERIOR`` kinds),
the guide term is :func:`aligner.training.guidance.guide_cross_entropy` of those posteriors.

The reverse batch is built from the forward batch's tensors (:func:`reverse_batch`), so the
pair is one module with the ``loss(src, tgt_in, tgt_out, ...)`` of a single model: the
training loop, gradient accumulation and DistributedDataParallel work unchanged.
:class:`AgreementTrainer` keeps the two models' weights where a model directory has them
(``fwd/params.*.pt``, ``rev/params.*.pt``) and the joint training state in ``joint/``.
"""
from __future__ import annotations

import logging
import math
import os
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from aligner import constants as C
from aligner.constants import BOS_ID, EOS_ID, PAD_ID
from aligner.config import RunConfig, TrainConfig
from aligner.data import EncodedCorpus
from aligner.distributed import DistributedContext
from aligner.training.guidance import guide_cross_entropy
from aligner.utils import check_condition
from aligner.model_dir import CORPUS_DIR, JOINT_DIR, direction_dir, load_params, save_params
from aligner.models import model_class
from aligner.models.base import AlignmentModel
from aligner.training.directions import load_init_weights
from aligner.training.loop import (TrainSummary, Trainer, Validation, seed_everything,
                                   use_deterministic_algorithms)

logger = logging.getLogger(__name__)


def reverse_batch(src: torch.Tensor, tgt_out: torch.Tensor
                  ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reverse direction's (src, tgt_in, tgt_out) of a forward batch (aligner.data.make_batch
    layout): src (B, J+1) = source ids + EOS + PAD, tgt_out (B, I+1) = target ids + EOS + PAD.

    Reverse src = forward tgt_out; reverse tgt_out = forward src; reverse tgt_in = BOS + the
    source ids (EOS dropped, PAD after), as ``make_batch(..., "rev")`` builds them.
    """
    bos = torch.full_like(src[:, :1], BOS_ID)
    shifted = src[:, :-1].masked_fill(src[:, :-1].eq(EOS_ID), PAD_ID)
    return tgt_out, torch.cat([bos, shifted], dim=1), src


def reverse_guide(guide: torch.Tensor) -> torch.Tensor:
    """The reverse direction's guide (B, J+1, I+1) of a forward guide (B, I+1, J+1): the same
    links, each source row normalized to sum to 1 (or 0 where a row has none), as
    :func:`aligner.training.guidance.guide_matrix` builds it for "rev"."""
    links = guide.gt(0).to(guide.dtype).transpose(1, 2)
    return links / links.sum(dim=-1, keepdim=True).clamp_min(1.0)


def disagreement(gamma_fwd: torch.Tensor, gamma_rev: torch.Tensor, src: torch.Tensor,
                 tgt_out: torch.Tensor) -> torch.Tensor:
    """Σ_b Σ_{i,j real words} (γ_fwd[b, i, j] − γ_rev[b, j, i])², a scalar.

    gamma_fwd (B, I+1, J+1), gamma_rev (B, J+1, I+1); src (B, J+1) and tgt_out (B, I+1) of the
    forward batch mark the real words (neither PAD nor EOS).
    """
    src_words = src.ne(PAD_ID) & src.ne(EOS_ID)
    tgt_words = tgt_out.ne(PAD_ID) & tgt_out.ne(EOS_ID)
    mask = tgt_words.unsqueeze(2) & src_words.unsqueeze(1)                      # (B, I+1, J+1)
    difference = (gamma_fwd - gamma_rev.transpose(1, 2)).masked_fill(~mask, 0.0)
    return difference.pow(2).sum()


class AgreementPair(nn.Module):
    """The forward and reverse model of one model directory, trained on the same batches.

    Both models must provide the contract's :meth:`~aligner.models.base.AlignmentModel.
    training_terms` (``TRAINS_POSTERIOR``: the direct HMMs). ``weight``: λ above.
    """

    def __init__(self, fwd: AlignmentModel, rev: AlignmentModel, weight: float):
        super().__init__()
        for model in (fwd, rev):
            check_condition(model.TRAINS_POSTERIOR,
                            f"agreement training needs both directions' posteriors: "
                            f"{type(model).__name__} does not provide them")
        self.fwd = fwd
        self.rev = rev
        self.weight = weight

    def loss(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
             label_smoothing: float = 0.0, guide: Optional[torch.Tensor] = None,
             guide_weight: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
        """(NLL_fwd + NLL_rev + λ·disagreement [+ guide terms of both directions], tokens of
        both decoders) of a forward batch; ``guide`` (B, I+1, J+1) is the forward one."""
        terms = self.terms(src, tgt_in, tgt_out, label_smoothing, guide, guide_weight)
        tokens = terms.pop("tokens")
        return sum(terms.values()), tokens

    def terms(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
              label_smoothing: float = 0.0, guide: Optional[torch.Tensor] = None,
              guide_weight: float = 0.0) -> Dict[str, torch.Tensor]:
        """The loss by term: nll_fwd, nll_rev, agreement (λ included), guide (if any) and the
        decoder token count ``tokens`` (not a loss: :meth:`loss` takes it out)."""
        guided = guide is not None and guide_weight > 0.0
        posterior = guided or self.weight > 0.0
        nll_fwd, tokens_fwd, log_fwd = self.fwd.training_terms(src, tgt_in, tgt_out,
                                                               label_smoothing, posterior)
        rev_src, rev_tgt_in, rev_tgt_out = reverse_batch(src, tgt_out)
        nll_rev, tokens_rev, log_rev = self.rev.training_terms(rev_src, rev_tgt_in, rev_tgt_out,
                                                               label_smoothing, posterior)
        terms = {"nll_fwd": nll_fwd, "nll_rev": nll_rev}
        if self.weight > 0.0:
            terms["agreement"] = self.weight * disagreement(log_fwd.exp(), log_rev.exp(), src,
                                                            tgt_out)
        if guided:
            guide_rev = reverse_guide(guide)
            terms["guide"] = guide_weight * (guide_cross_entropy(log_fwd, guide)
                                             + guide_cross_entropy(log_rev, guide_rev))
        terms["tokens"] = tokens_fwd + tokens_rev
        return terms

    def forward(self, *args, **kwargs):  # an nn.Module needs one; training calls loss()
        return self.loss(*args, **kwargs)


def check_agreement_resumable(model_dir: str) -> None:
    """Refuse (one line) to resume an agreement run whose directions have weights but whose
    joint training state is missing: training would start again and replace them."""
    state = os.path.join(model_dir, JOINT_DIR, C.TRAINING_STATE)
    weights = [os.path.join(direction, name) for direction in C.DIRECTIONS
               for name in (C.PARAMS_LAST, C.PARAMS_BEST)
               if os.path.isfile(os.path.join(direction_dir(model_dir, direction), name))]
    check_condition(os.path.isfile(state) or not weights,
                    f"{state}: missing, but {weights[0] if weights else ''} holds trained "
                    f"weights: --resume cannot continue this agreement run (use --overwrite to "
                    f"train a new model)")


class AgreementTrainer(Trainer):
    """A :class:`aligner.training.loop.Trainer` of an :class:`AgreementPair` (one optimizer over
    both models' weights).

    It reads forward batches of `corpus` (the pair builds the reverse ones), counts the tokens
    of both decoders, writes each model's weights into its direction folder of `model_dir`
    (``fwd/params.*.pt``, ``rev/params.*.pt``, as extraction expects them) and the joint
    training state and metrics into ``model_dir/joint`` (`model_dir` None: write nothing).
    Validation: each direction's perplexity and AER; the run's score is the mean AER of the
    two directions (without gold: the geometric mean of their perplexities).
    """

    def __init__(self, pair: AgreementPair, corpus: EncodedCorpus, config: TrainConfig,
                 model_dir: Optional[str], device: torch.device,
                 context: Optional[DistributedContext] = None,
                 validation: Optional[Validation] = None, progress: bool = True):
        out_dir = None if model_dir is None else os.path.join(model_dir, JOINT_DIR)
        super().__init__(pair, corpus, "fwd", config, out_dir, device, context, validation,
                         progress)
        self.pair = pair
        self.model_dir = model_dir
        self.name = "fwd+rev"
        self._decoder_tokens = corpus.src_lengths + corpus.tgt_lengths + 2

    def make_loss_module(self, model: AgreementPair) -> nn.Module:
        """The pair itself: its ``forward`` is :meth:`AgreementPair.loss`, which adds the
        agreement and guide terms to both directions' NLL (it checked both models' posteriors
        when it was built)."""
        return model

    def _direction_path(self, direction: str, name: str) -> str:
        folder = direction_dir(self.model_dir, direction)
        os.makedirs(folder, exist_ok=True)
        return os.path.join(folder, name)

    def save_weights(self, improved: bool) -> None:
        for direction in C.DIRECTIONS:
            model = getattr(self.pair, direction)
            save_params(model, self._direction_path(direction, C.PARAMS_LAST))
            if improved:
                save_params(model, self._direction_path(direction, C.PARAMS_BEST))

    def weight_models(self) -> Dict[str, AlignmentModel]:
        return {direction: getattr(self.pair, direction) for direction in C.DIRECTIONS}

    def load_weights(self) -> None:
        for direction in C.DIRECTIONS:
            load_params(getattr(self.pair, direction),
                        self._direction_path(direction, C.PARAMS_LAST))

    def can_resume(self) -> bool:
        if self.model_dir is None:
            return False
        check_agreement_resumable(self.model_dir)
        return os.path.isfile(self._path(C.TRAINING_STATE))

    def validate(self) -> Dict[str, Optional[float]]:
        if self.validation is None:
            return {"valid_ppl": None, "valid_aer": None}
        ppl = [self.validation.perplexity(getattr(self.pair, d), d, self.device, self.precision)
               for d in C.DIRECTIONS]
        aer = [self.validation.aer(getattr(self.pair, d), d, self.device)
               for d in C.DIRECTIONS]
        logger.info("[fwd+rev] validation: ppl fwd %.2f rev %.2f%s", ppl[0], ppl[1],
                    "" if aer[0] is None else
                    f", AER fwd {100 * aer[0]:.1f}% rev {100 * aer[1]:.1f}%")
        return {"valid_ppl": math.exp(sum(math.log(max(p, 1e-30)) for p in ppl) / 2),
                "valid_aer": None if aer[0] is None else (aer[0] + aer[1]) / 2}


def supports_agreement(model_kind: str) -> bool:
    """Whether `model_kind` gives the differentiable posteriors agreement training compares
    and trains in one stage (the alignment layer's posterior sits on a frozen base: its
    agreement is not implemented)."""
    cls = model_class(model_kind)
    return cls.TRAINS_POSTERIOR and cls.BASE_KIND is None


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
    them together with the agreement term (aligner/training/agreement.py) from the encoded corpus in
    MODEL_DIR/corpus."""
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
