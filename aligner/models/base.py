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

Models know nothing of files, vocabularies or BPE: they see id tensors only.
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch
from torch import nn


class AlignmentModel(nn.Module):
    """Base class: a translation model in one direction that exposes soft alignments."""

    #: extraction methods this model kind supports (names used by `align extract --method`)
    METHODS: Tuple[str, ...] = ()
    #: the symmetrization that combines this kind's two directions best (eval/results):
    #: `align extract`'s default -H for the kind
    BEST_HEURISTIC: str = "grow-diag"

    def loss(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
             label_smoothing: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
        """Training loss summed over non-pad target tokens, and the number of those tokens.

        Returns (loss_sum: scalar tensor, n_tokens: scalar tensor). The trainer divides.
        """
        raise NotImplementedError

    def alignment_scores(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                         method: str, **options) -> torch.Tensor:
        """Soft alignment (B, I+1, J+1) for `method`; larger = more strongly aligned.

        Rows are target positions, columns source positions. The caller masks padding and EOS
        and takes argmax over source positions (or a Viterbi path, for methods that return one).
        """
        raise NotImplementedError

    def extra_state(self) -> Dict:
        """Anything beyond parameters that must be saved with the weights (default: nothing)."""
        return {}
