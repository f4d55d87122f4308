"""The interface every model kind implements (transformer, hmm0, hmm1, alignment-layer).

Tensor conventions (all models, both directions; "source" = encoder side, "target" = decoder
side of *this* direction's model):

* ``src``     LongTensor (B, J+1): source subword ids followed by EOS, right-padded with PAD.
* ``tgt_in``  LongTensor (B, I+1): BOS followed by target subword ids, right-padded with PAD.
* ``tgt_out`` LongTensor (B, I+1): target subword ids followed by EOS, right-padded with PAD.
  Decoder position i reads ``tgt_in[:, :i+1]`` and predicts ``tgt_out[:, i]``; the alignment of
  target token i (0-based) is read at decoder position i.
* Padding masks are derived from the ids (``== PAD_ID``); models take no separate mask tensors.
* Alignment score tensors are (B, I+1, J+1), indexed [batch, target position, source position];
  the EOS source column and the EOS target row are returned but never aligned (inference masks
  them together with padding).
* Incremental decoding (:meth:`AlignmentModel.init_decode_state`, :meth:`~AlignmentModel.
  decode_step`, :meth:`~AlignmentModel.reorder_decode_state`; the beam search of
  aligner/translate.py): a :data:`DecodeState` holds N hypotheses (rows), each step reads the
  newest token of every row and returns log p(next token | prefix, source) (N, V).

Models know nothing of files, vocabularies or BPE: they see id tensors only.
"""
from __future__ import annotations

import abc
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

#: the state of N hypotheses being decoded (:meth:`AlignmentModel.init_decode_state`): a dict
#: whose tensors, and lists or tuples of tensors, have one row per hypothesis along dim 0 (what
#: :func:`select_rows` selects); other values (ints, options) are shared by all rows
DecodeState = Dict[str, Any]


def select_rows(value: Any, rows: torch.Tensor) -> Any:
    """Rows `rows` (N',) of a per-row tensor, of each tensor in a list or tuple, or of each
    value of a :data:`DecodeState` (leading dim = rows); anything else is returned as it is."""
    if isinstance(value, torch.Tensor):
        return value.index_select(0, rows)
    if isinstance(value, dict):
        return {key: select_rows(item, rows) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(select_rows(item, rows) for item in value)
    return value


def model_device(model: nn.Module) -> torch.device:
    """The device of a model's parameters, else of its buffers (a kind whose tables are
    buffers: the classical aligner), else the CPU."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


class AlignmentModel(nn.Module, abc.ABC):
    """Base class: a translation model in one direction that exposes soft alignments.

    The contract of a model kind (``tests/test_model_contract.py`` checks every registered
    kind). Abstract, so that a kind missing one of them cannot be instantiated:

    * :attr:`METHODS` — the extraction methods it supports (names used by ``align extract
      --method``; the first is the default);
    * :attr:`config_class` — a dataclass with ``to_dict()`` / ``from_dict()`` holding every
      hyper-parameter (including ``max_positions``, ``markov_order`` and the vocabulary
      sizes); ``cls(config)`` builds the model, which keeps it as ``self.config``;
    * :meth:`loss` and :meth:`alignment_scores`;
    * incremental decoding for translation: :meth:`init_decode_state` and :meth:`decode_step`
      (with :meth:`reorder_decode_state`, whose default selects rows, they are all the beam
      search of aligner/translate.py knows of a model; the alignments it prints come from
      :meth:`alignment_scores` / :meth:`alignment_path` on the finished output).

    Optional hooks, with the defaults defined here (override where the kind needs them):

    * :attr:`BEST_HEURISTIC` (``"grow-diag"``), :attr:`TRANSLATE_ALIGNMENT_METHOD` (None:
      the first of :attr:`METHODS`), :attr:`BASE_KIND` (None: trained in one stage);
    * :meth:`alignment_path` (None: extraction takes the argmax of the scores);
    * :meth:`extra_state` / :meth:`load_extra_state` (nothing beyond the parameters);
    * :meth:`split_options` and :meth:`load_base` (two-stage kinds with a ``BASE_KIND``);
    * :attr:`TRAINS_POSTERIOR` (False) with :meth:`training_terms`: a kind whose training
      can use its differentiable alignment posterior. Guided and agreement training are
      made of these terms only: the trainer adds the guide term
      (:func:`aligner.training.loop.guided_loss`) and the agreement term
      (:class:`aligner.training.agreement.AgreementPair`) to them; a kind without them is refused
      both.
    """

    #: every instance keeps the config it was built from (an instance of `config_class`)
    config: Any

    #: the symmetrization that combines this kind's two directions best (eval/results):
    #: `align extract`'s default -H for the kind
    BEST_HEURISTIC: str = "grow-diag"
    #: whether :meth:`training_terms` gives a differentiable alignment posterior: what guided
    #: training (aligner/training/guidance.py, ``align train --guide``, self-training rounds) and
    #: agreement training (aligner/training/agreement.py, ``--agreement-weight``) need; rounds
    #: and agreement also need a one-stage kind (no :attr:`BASE_KIND`)
    TRAINS_POSTERIOR: bool = False
    #: whether guided training sends a decoder token that the guide leaves without a link to
    #: the EOS column, the kind's "not aligned" (:func:`aligner.training.guidance.
    #: unaligned_to_eos`; the guided alignment layer). False: such a token has no guide term
    GUIDE_UNALIGNED_TO_EOS: bool = False
    #: the methods that take the extraction option ``shortlist`` (the lexicon normalized over
    #: the most frequent words and the sentence's own; `align extract`'s default for them:
    #: aligner/training/recipe.py SHORTLIST)
    SHORTLIST_METHODS: Tuple[str, ...] = ()
    #: the default method of `align translate --print-alignment` (None: ``METHODS[0]``)
    TRANSLATE_ALIGNMENT_METHOD: Optional[str] = None
    #: the kind of the frozen base this kind is trained on (two-stage training, see
    #: aligner.training.run.train); None: an ordinary one-stage kind
    BASE_KIND: Optional[str] = None
    #: trained by EM over the corpus (aligner/training/classical.py), not by the training
    #: loop: the classical aligner
    TRAINED_BY_EM: bool = False
    #: whether :meth:`init_decode_state` / :meth:`decode_step` translate (`align translate`)
    TRANSLATES: bool = True
    #: positions per inference batch on a CPU when the caller gives none (None: the
    #: extraction's own default, aligner.extract.inference.CPU_MAX_TOKENS)
    CPU_MAX_TOKENS: Optional[int] = None

    @property
    @abc.abstractmethod
    def METHODS(self) -> Tuple[str, ...]:
        """Extraction methods this model kind supports (a class attribute tuple in each kind;
        the first is `align extract`'s default)."""

    @property
    @abc.abstractmethod
    def config_class(self) -> type:
        """The kind's config dataclass (a class attribute in each kind)."""

    @abc.abstractmethod
    def loss(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
             label_smoothing: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
        """Training loss summed over non-pad target tokens, and the number of those tokens.

        Returns (loss_sum: scalar tensor, n_tokens: scalar tensor). The trainer divides. The
        model's own loss only: a guide or agreement term is added by the trainer, from
        :meth:`training_terms`.
        """

    @abc.abstractmethod
    def alignment_scores(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                         method: str, **options) -> torch.Tensor:
        """Soft alignment (B, I+1, J+1) for `method`; larger = more strongly aligned.

        Rows are target positions, columns source positions. The caller masks padding and EOS
        and takes argmax over source positions (or a Viterbi path, for methods that return one).
        """

    @abc.abstractmethod
    def init_decode_state(self, src: torch.Tensor, **options) -> DecodeState:
        """The decoding state of N hypotheses from their sources src (N, J+1) (ids + EOS,
        right-padded), before any target token: the encoder runs here, once.

        ``options``: the kind's own decoding settings (none unless the kind documents some);
        the first :meth:`decode_step` then reads BOS.
        """

    @abc.abstractmethod
    def decode_step(self, state: DecodeState, prev_tokens: torch.Tensor
                    ) -> Tuple[torch.Tensor, DecodeState]:
        """One output position: (log p(next token | prefix, source) (N, V) float32, new state).

        prev_tokens (N,): the newest token of every row (BOS at the first step, then the word
        the search chose for that row). Exactly the full-sequence translation model: the sum
        of the log-probabilities of an output (EOS included) is the negative of :meth:`loss`
        of the pair without label smoothing (for a kind with a :attr:`BASE_KIND`, of its
        base's loss: the alignment layer translates with its frozen base; tests/
        test_translate.py, tests/test_model_contract.py). The given state is not changed.
        """

    def reorder_decode_state(self, state: DecodeState, rows: torch.Tensor) -> DecodeState:
        """Keep hypotheses `rows` (N',) of the state (a row may be kept several times): the
        beam search calls it after each step, before extending row k by its chosen word,
        which the next :meth:`decode_step` reads. Default: :func:`select_rows`."""
        return select_rows(state, rows)

    def leaves_unaligned_mass(self, method: str) -> bool:
        """Whether `method`'s score rows are probabilities that sum to p(aligned) ≤ 1 over the
        real source positions, the rest meaning "not aligned" (e.g. a direct HMM with the
        empty word). Extraction then neither renormalizes them over the real positions
        (soft matrices) nor links a word whose best link is less likely than the rest (hard
        links; aligner/extract/inference.py). Default: False (rows are renormalized)."""
        return False

    def alignment_path(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                       method: str, **options) -> Optional[torch.Tensor]:
        """A hard path (B, I+1) of the model's own for `method`, or None (the default): the
        extraction hook of aligner/extract/inference.py, see
        :func:`~aligner.extract.inference.hard_alignment`.

        Per target position i the aligned source position j (0-based, in [0, J]) or -1 for
        "not aligned". None: extraction takes the argmax of :meth:`alignment_scores`.
        """
        return None

    def training_terms(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                       label_smoothing: float = 0.0, posterior: bool = False
                       ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """The terms guided and agreement training are made of: (nll, tokens, log_posterior).

        * nll: scalar, :meth:`loss`'s first value (summed over the non-pad target tokens,
          with the same ``label_smoothing``);
        * tokens: scalar, :meth:`loss`'s second value (the count of those tokens);
        * log_posterior (B, I+1, J+1) when ``posterior``, else None (not computed): log q[b,
          i, j], the model's alignment distribution of decoder position i (the token
          ``tgt_out[b, i]``) over encoder positions j (the EOS column included; the direct
          HMMs: the distribution ``hmm-posterior`` extracts); each row of a non-pad target
          token sums to 1 in probability. Differentiable: the guide's cross-entropy
          and the agreement term train the model through it. Values at padding are
          unspecified (the guide is 0 there and the agreement term masks them).

        Kinds with :attr:`TRAINS_POSTERIOR` implement it; the default refuses."""
        raise NotImplementedError(f"{type(self).__name__} has no differentiable alignment "
                                  f"posterior (TRAINS_POSTERIOR is False)")

    def extra_state(self) -> Dict:
        """Anything beyond parameters that must be saved with the weights (default: nothing)."""
        return {}

    def load_extra_state(self, state: Dict) -> None:
        """Read back what :meth:`extra_state` saved (default: nothing to read)."""

    @classmethod
    def split_options(cls, options: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """Model options -> (options of the base model, options of this kind's own part).

        Used for kinds with a :attr:`BASE_KIND` only; the default (no base) keeps every
        option for the kind itself: ``({}, options)``.
        """
        return {}, dict(options)

    def load_base(self, state_dict: Dict[str, torch.Tensor]) -> None:
        """Copy a trained :attr:`BASE_KIND` model's weights (its state_dict) into this model.

        Only kinds with a :attr:`BASE_KIND` implement it; the default refuses.
        """
        raise NotImplementedError(f"{type(self).__name__} is not trained on a base model "
                                  f"(BASE_KIND is None)")
