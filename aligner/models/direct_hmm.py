"""Transformer-based direct HMM, zero-order (``hmm0``) and first-order (``hmm1``).

Wang, Alkhouli, Herold, Ney: *Transformer-Based Direct Hidden Markov Model for Machine
Translation* (ACL-SRW 2021), sec. 4.1 and 4.2. Notation: h_j encoder output (B, J+1, d),
s_i decoder state (B, I+1, d); tensor conventions of aligner/models/base.py (src ends with EOS,
tgt_in = BOS + ids, tgt_out = ids + EOS, scores (B, I+1, J+1) [batch, target i, source j]).

Architecture (pre-norm, like aligner/models/transformer.py):

* Encoder: the transformer's encoder, unchanged.
* Decoder layers 1..L-1 (:class:`HMMDecoderLayer`): causal self-attention (with residual), then
  the *HMM context* in place of cross-attention and its residual:
  c_i = Σ_j α_h(j|i) · W1·relu(W2·h_j + W3·s_i), per head h (the relu features are split into H
  head slices, each weighted by its own head's α_h; W1 is applied after the sum, which equals
  applying it inside because W1 is linear), then a feed-forward block with residual. With
  ``context="attention"`` the transformer's cross-attention with its residual instead.
* Last layer (:class:`HMMOutputLayer`): causal self-attention (with residual) gives s_i^(L), then
  - lexicon  log p_lex(e_i | j) = log_softmax(W4·relu(W5·h_j + W6·s_i^(L)))[e_i]
    (hidden size k = ``lexicon_dim``, default d; W4 tied to the target embedding when k = d and
    ``tie_embeddings``), computed by :func:`lexicon_log_probs` in chunks of target positions
    (never the whole (B, I, J, V)). It costs J·V·k multiply-adds per target token, J times
    the baseline's output layer: the speed knobs are ``lexicon_dim`` (exact, smaller k) and
    ``lexicon_sample`` (training softmax over the batch's words plus sampled others only);
    with ``lexicon_activation="linear"`` the relu is dropped, log p_lex(e_i | j) =
    log_softmax(W4·(W5·h_j + W6·s_i)), whose logits split into a target and a source part so
    that the exact normalizer of all (i, j) is one matrix product
    (:func:`linear_lexicon_log_probs`: (I + J)·V·k + I·J·V per sentence);
  - zero-order alignment α(j|i): ONE dedicated single-head attention of s_i^(L) over h_j
    (its own query/key projections; not an average of heads);
  - first-order alignment α(j|i,j') (:class:`FirstOrderAlignment`): query W_q·s_i^(L-1) (the
    output of layer L-1, i.e. the last layer's normalized input) against the key
    W_o·relu(W_a·h_j + W_b·h_j' + D[jump(j - j')]) — the transform of [h_j ; h_j'] needs the
    non-linearity, otherwise h_j' adds the same constant to every j and cancels in the softmax.
    D is a learned embedding of the clipped jump width (the classic HMM alignment feature).
    The start state j' = "before the sentence" uses a learned vector in place of h_j' and
    position -1.

Alignment states: **all J+1 source positions, EOS included**. The target EOS (and target words
with no counterpart) must be generated from some state; the source EOS serves as that state
(a NULL-like word). Padded source positions get α = 0. Links to the source EOS are never output:
inference masks the EOS column, and ``hmm-viterbi`` runs on paths that align every real target
word to a real source word.

The empty word (optional, ``DirectHMMConfig.null_word``): each emission becomes a gated mixture
p(e_i | j) = (1 − p0_i)·p_lex(e_i | j) + p0_i·p_lex(e_i | ∅) (:meth:`DirectHMM.emissions`), so
a word with no counterpart can be explained without a link. Losses, posteriors, Viterbi and
decoding below then read "emission" for p_lex; the posterior of a link is taken with respect to
the link part (1 − p0_i)·p_lex(e_i | j) only, so its rows sum to p(e_i aligned) < 1, and
``hmm-viterbi`` leaves a word unaligned where the empty word's part of its state's emission is
the larger.

Losses (summed over non-pad target tokens; label smoothing ε is applied to the lexicon:
log p̃_lex(e_i|j) = (1-ε)·log p_lex(e_i|j) + ε·mean_v log p_lex(v|j)):

* hmm0: −Σ_i log Σ_j exp(log α(j|i) + log p̃_lex(e_i|j))
* hmm1: −log Z, Z = Σ_j Q(I, j), forward recursion of aligner/models/hmm_algorithms.py; the
  backward pass is autograd. Each sentence's log Z is read at its own last target position.

Extraction methods (``alignment_scores``, (B, I+1, J+1), larger = more strongly aligned):

* ``hmm-alignment`` — hmm0: α(j|i); hmm1: greedy α path, b_i = argmax_j α(j|i, b_{i-1}) as
  one-hot rows (like hmm0's, it never looks at the word e_i itself).
* ``hmm-posterior`` — hmm0: α(j|i)·p_lex(e_i|j) normalized over j; hmm1: the forward–backward
  posterior γ(i,j) = ∂ log Z / ∂ log p_lex(e_i|j) (autograd).
* ``hmm-viterbi`` (hmm1) — one-hot rows of the best path (max-product).
For hmm1's two path methods ``alignment_path`` (the hook of aligner/extract/inference.py) returns
the path itself, so a word the greedy path puts on the source EOS stays unaligned.
Extraction uses the un-smoothed lexicon (ε = 0).

Decoding (``decode_step``, the contract of aligner/models/base.py; l_j = log p_lex(e | j), the
lexicon of source position j, EOS state included), the state holding the decoder's layer
history (aligner/models/transformer.py: :func:`~aligner.models.transformer.layer_history`):

* hmm0: log p(e | e_<i, f) = log Σ_j α(j|i) · p_lex(e|j) — the beam runs over the mixture;
* hmm1: prior π_i(j) = Σ_j' q_{i-1}(j') · α(j|i, j') (α(j|0, start) at i = 0, the step of
  :func:`~aligner.models.hmm_algorithms.forward_step`), log p(e) = log Σ_j π_i(j) · p_lex(e|j);
  once e is chosen (it is the next step's ``prev_tokens``) the forward state becomes
  q_i(j) = π_i(j) · p_lex(e|j) / p(e). The sum of log p(e) over a hypothesis is log Z of the
  forward algorithm, i.e. exactly the training objective of the output. hmm1's alignment keys
  (N, J+1, J, d) depend on the source only: computed once per sentence in
  ``init_decode_state``, not at every output position.

The lexicon of one step, log p_lex(v|j) for N rows × (J+1) positions × V words, is never held
whole: :func:`mixture_log_probs` runs over chunks of source positions with a running logsumexp
(``init_decode_state``'s option ``lexicon_floats``, default :data:`LEXICON_CHUNK_FLOATS`), and
hmm1 recomputes only the chosen words' entries when it updates q.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from aligner.constants import EOS_ID, PAD_ID
from aligner.models import hmm_algorithms
from aligner.models.base import AlignmentModel, DecodeState
from aligner.models.transformer import (Embedding, Encoder, FeedForward, MultiHeadAttention,
                                        TransformerConfig, decoder_self_attention,
                                        init_decoder_history, layer_history, next_decode_state,
                                        static_history)
from aligner.precision import active_autocast_dtype
from aligner.utils import check_condition


LEXICON_ACTIVATIONS = ("relu", "linear")
#: the lower decoder layers' source context (DirectHMMConfig.context)
DECODER_CONTEXTS = ("mlp", "attention")
#: the empty word's gate starts at p0 = σ(−2) ≈ 0.12 for every target word
NULL_GATE_BIAS = -2.0

FORWARD_ALGORITHMS = {"loop": hmm_algorithms.forward_log_z,
                      "tree": hmm_algorithms.forward_log_z_parallel}


@dataclass
class DirectHMMConfig(TransformerConfig):
    """Transformer hyper-parameters plus the direct HMM's own (saved in config.json)."""

    #: target positions per lexicon chunk: only (B, chunk, J+1, V) logits exist at once, in the
    #: forward and (by recomputation) the backward pass; 0 = no chunking (whole tensor)
    lexicon_chunk: int = 8
    #: hidden size k of the lexicon W4·relu(W5·h_j + W6·s_i) (0 = d_model, W4 tied to the
    #: target embedding when tie_embeddings); the lexicon costs J·V·k per target token
    lexicon_dim: int = 0
    #: training only: normalize the lexicon over this many candidate words per batch (the
    #: batch's observed target words, filled up with uniformly drawn others; Jean et al. 2015)
    #: instead of the whole vocabulary; 0 = whole vocabulary. Evaluation is always exact.
    lexicon_sample: int = 0
    #: the lexicon's activation: "relu" (W4·relu(W5·h_j + W6·s_i)) or "linear"
    #: (W4·(W5·h_j + W6·s_i), whose logits split into a target part a_i and a source part b_j,
    #: so that the normalizer Σ_v exp(a_iv + b_jv) of all (i, j) is one matrix product:
    #: I·J·V instead of I·J·V·k per sentence; :func:`linear_lexicon_log_probs`)
    lexicon_activation: str = "relu"
    #: first-order model: jump widths |j - j'| above this share one embedding
    max_jump: int = 16
    #: the lower decoder layers' source context: "mlp" (:class:`HMMContext`, c_i = W1·Σ_j α(j|i)·
    #: relu(W2·h_j + W3·s_i), Wang et al. 2018's direct HMM; a (B, I, J, d) feature tensor
    #: per layer, with the first-order features the largest elementwise costs of a training
    #: step) or "attention" (the transformer's cross-attention with a residual). On en-fr 25k,
    #: with alignment_dim 32:
    #: 1.24x the training speed on CPU but dev AER 11.1 against 9.7 after one epoch
    #: (eval/results/decoder_context.md), so "mlp" stays the default
    context: str = "mlp"
    #: first-order model (hmm1; hmm0 has no such features and ignores it): width a of the
    #: alignment features relu(W_a·h_j + W_b·h_j' + D[jump]) (0 = d_model), a (B, J+1, J, a)
    #: tensor per batch (eval/results/decoder_context.md). 32 on en-fr 25k: 1.12x the training
    #: speed, the whole job 19 min 44 s, but dev 6.5 against 6.2 (seed 1;
    #: eval/results/model_size_enfr.md), so 0 stays the default
    alignment_dim: int = 0
    #: first-order forward algorithm: "loop" over target positions or log-semiring "tree"
    #: reduction (same value; the loop is faster on CPU, see eval/results/hmm_forward.md)
    forward_algorithm: str = "loop"
    #: first-order model: the (B, I+1, J+2, J+1) transition scores grow with the cube of the
    #: sentence length; at most about this many floats of them exist at once (target positions
    #: per chunk = this // (B·(J+2)·(J+1)), at least 1). Training recomputes the chunks in
    #: backward (checkpointing) only when a batch does not fit in one; 0 = no limit. Inference
    #: uses the same budget for the chunks of the exact lexicon.
    chunk_floats: int = 1 << 24
    #: the empty word (Och & Ney 2003's NULL, as a mixture in the emission): target word e_i is
    #: generated by its state's source position j with probability 1 − p0_i, or by the empty
    #: word with p0_i = sigmoid(w·(W6·s_i) + b), from the lexicon of a learned source vector
    #: in place of W5·h_j (it sees the target context, never the source):
    #: p(e_i | j) = (1 − p0_i)·p_lex(e_i | j) + p0_i·p_lex(e_i | ∅). The alignment chain is
    #: unchanged (the state still moves by α; the empty word only changes what emits the word;
    #: unlike Och & Ney's NULL states, which keep the previous position). Posteriors then
    #: count the link part only: γ_link(i, j) = γ(i, j)·(1 − p0_i)·p_lex(e_i|j) / p(e_i|j),
    #: rows summing to 1 − p(e_i unaligned | e, f).
    null_word: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_condition(self.dec_layers >= 1, "the direct HMM needs at least one decoder layer")
        check_condition(self.lexicon_chunk >= 0,
                        f"lexicon_chunk must be >= 0 (0 = no chunking): {self.lexicon_chunk}")
        check_condition(self.lexicon_dim >= 0 and self.lexicon_sample >= 0,
                        "lexicon_dim and lexicon_sample must be >= 0")
        check_condition(self.lexicon_activation in LEXICON_ACTIVATIONS,
                        f"lexicon_activation must be one of {', '.join(LEXICON_ACTIVATIONS)}: "
                        f"{self.lexicon_activation}")
        check_condition(self.max_jump >= 1, f"max_jump must be >= 1: {self.max_jump}")
        check_condition(self.context in DECODER_CONTEXTS,
                        f"context must be one of {', '.join(DECODER_CONTEXTS)}: {self.context}")
        check_condition(self.alignment_dim >= 0,
                        f"alignment_dim must be >= 0 (0 = d_model): {self.alignment_dim}")
        check_condition(self.chunk_floats >= 0,
                        f"chunk_floats must be >= 0 (0 = no limit): {self.chunk_floats}")
        check_condition(self.forward_algorithm in FORWARD_ALGORITHMS,
                        f"forward_algorithm must be one of {', '.join(FORWARD_ALGORITHMS)}: "
                        f"{self.forward_algorithm}")


# -- lexicon ---------------------------------------------------------------------------------

def lexicon_logits(source_hidden: torch.Tensor, target_hidden: torch.Tensor,
                   weight: torch.Tensor, bias: Optional[torch.Tensor],
                   words: Optional[torch.Tensor] = None, dtype: Optional[torch.dtype] = None,
                   activation: str = "relu") -> Tuple[torch.Tensor, torch.Tensor]:
    """The lexicon's logits W4·relu(W5·h_j + W6·s): the one place the formula is written
    (besides the linear lexicon's factored form in :func:`linear_lexicon_log_probs`).

    Used by training (:func:`lexicon_log_probs`: :func:`_lexicon_chunk`, the forward and the
    recomputing backward of :class:`_ChunkedLexicon`), by extraction off the CPU fast path,
    and by incremental decoding (:func:`mixture_log_probs` and hmm1's forward update in
    :meth:`FirstOrderHMM.decode_step`). The CPU extraction kernel
    :func:`_lexicon_inference_cpu` is a cache-blocked rewrite of it (bias as an extra column
    of W4), tested against it.

    Args:
        source_hidden: W5·h_j, (..., J, k); target_hidden: W6·s, broadcastable against it
            (e.g. (B, c, 1, k) with source (B, 1, J, k), or (N, 1, k) with source (N, J, k)).
        weight, bias: W4 (V, k) and its bias (V,) or None.
        words: None for the logits of the whole vocabulary; or (N,) one word per row of a
            (N, J, k) hidden layer: only that word's logits (N, J), float32.
        dtype: the matmul's dtype when it differs from the hidden layer's (the hidden layer
            is cast before the matmul; whole vocabulary only).
        activation: "relu", or "linear" (no activation: W4·(W5·h_j + W6·s); training and
            extraction then take the factored :func:`linear_lexicon_log_probs`).
    Returns:
        (hidden layer relu(W5·h_j + W6·s), or the plain sum when linear, (..., J, k) in the
        inputs' dtype, logits: (..., J, V)
        in the matmul's dtype, or (N, J) float32 with `words`).
    """
    hidden = source_hidden + target_hidden
    if activation == "relu":
        hidden = F.relu(hidden)
    if words is not None:
        logits = torch.einsum("njk,nk->nj", hidden, weight.index_select(0, words)).float()
        if bias is not None:
            logits = logits + bias.index_select(0, words)[:, None].float()
        return hidden, logits
    return hidden, F.linear(hidden if dtype is None else hidden.to(dtype), weight, bias)


def _lexicon_chunk(source_hidden: torch.Tensor, target_hidden: torch.Tensor,
                   weight: torch.Tensor, bias: Optional[torch.Tensor], targets: torch.Tensor,
                   smoothing: float) -> torch.Tensor:
    """Lexicon scores of one chunk of target positions.

    source_hidden (B, J, k) = W5·h_j, target_hidden (B, c, k) = W6·s_i, weight (V, k) = W4,
    targets (B, c) -> (B, c, J): (1-ε)·log p_lex(e_i|j) + ε·mean_v log p_lex(v|j).
    Materializes the (B, c, J, V) logits.
    """
    _, logits = lexicon_logits(source_hidden.unsqueeze(1), target_hidden.unsqueeze(2),
                               weight, bias)                                    # (B, c, J, V)
    log_norm = torch.logsumexp(logits.float(), dim=-1)                          # (B, c, J)
    index = targets[:, :, None, None].expand(-1, -1, logits.size(2), 1)
    scores = logits.gather(-1, index).squeeze(-1).float() - log_norm
    if smoothing > 0.0:
        uniform = logits.float().mean(dim=-1) - log_norm
        scores = (1.0 - smoothing) * scores + smoothing * uniform
    return scores


def _compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype of the lexicon matmuls: autocast's when it is on (bf16 on CUDA), else W4's."""
    return active_autocast_dtype(weight.device.type) or weight.dtype


class _ChunkedLexicon(torch.autograd.Function):
    """:func:`_lexicon_chunk` over chunks of target positions with a hand-written backward.

    Forward keeps only the log normalizers (B, I, J); backward recomputes each chunk's logits
    and turns them in place into d score / d logits = (1-ε)·[v = e_i] + ε/V − softmax_v, so
    that one (B, chunk, J, V) float32 block is alive at any time. Matmuls run in the
    autocast dtype (bf16 on CUDA), softmax arithmetic in float32 (or float64 for float64 inputs).
    """

    @staticmethod
    def forward(ctx, source_hidden, target_hidden, weight, bias, targets, smoothing, chunk):
        dtype = _compute_dtype(weight)
        accumulate = torch.promote_types(dtype, torch.float32)    # softmax arithmetic
        with torch.autocast(device_type=weight.device.type, enabled=False):
            w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
            scores, log_norms = [], []
            for start in range(0, target_hidden.size(1), chunk):
                _, logits = lexicon_logits(source_hidden.unsqueeze(1),
                                           target_hidden[:, start:start + chunk].unsqueeze(2),
                                           w, b, dtype=dtype)
                logits = logits.to(accumulate)                                  # (B, c, J, V)
                log_norm = torch.logsumexp(logits, dim=-1)
                index = targets[:, start:start + chunk, None, None].expand(
                    -1, -1, logits.size(2), 1)
                score = logits.gather(-1, index).squeeze(-1) - log_norm
                if smoothing > 0.0:
                    score = (1.0 - smoothing) * score + smoothing * (logits.mean(-1) - log_norm)
                scores.append(score)
                log_norms.append(log_norm)
        ctx.save_for_backward(source_hidden, target_hidden, weight, bias, targets,
                              torch.cat(log_norms, dim=1))
        ctx.smoothing, ctx.chunk, ctx.dtype, ctx.accumulate = smoothing, chunk, dtype, accumulate
        return torch.cat(scores, dim=1)

    @staticmethod
    def backward(ctx, grad_scores):
        source_hidden, target_hidden, weight, bias, targets, log_norm_all = ctx.saved_tensors
        smoothing, chunk, dtype, accumulate = ctx.smoothing, ctx.chunk, ctx.dtype, ctx.accumulate
        vocab = weight.size(0)
        grad_source = torch.zeros_like(source_hidden, dtype=accumulate)
        grad_target = torch.zeros_like(target_hidden, dtype=accumulate)
        grad_weight = torch.zeros_like(weight, dtype=accumulate)
        grad_bias = None if bias is None else torch.zeros_like(bias, dtype=accumulate)
        with torch.autocast(device_type=weight.device.type, enabled=False):
            w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
            for start in range(0, target_hidden.size(1), chunk):
                stop = start + chunk
                hidden, logits = lexicon_logits(source_hidden.unsqueeze(1),
                                                target_hidden[:, start:stop].unsqueeze(2),
                                                w, b, dtype=dtype)             # (B, c, J, k)
                hidden_c = hidden.to(dtype)
                logits = logits.to(accumulate)                                  # (B, c, J, V)
                grad = grad_scores[:, start:stop].to(accumulate).unsqueeze(-1)  # (B, c, J, 1)
                # softmax in place, then d score / d logits, all in the same buffer
                grad_logits = logits.sub_(log_norm_all[:, start:stop].unsqueeze(-1)).exp_()
                grad_logits.mul_(-grad)
                if smoothing > 0.0:
                    grad_logits.add_(grad * (smoothing / vocab))
                index = targets[:, start:stop, None, None].expand(-1, -1, logits.size(2), 1)
                grad_logits.scatter_add_(-1, index, grad * (1.0 - smoothing))
                if grad_bias is not None:
                    grad_bias += grad_logits.sum(dim=(0, 1, 2))
                grad_logits_c = grad_logits.to(dtype)
                grad_weight += (grad_logits_c.reshape(-1, vocab).t()
                                @ hidden_c.reshape(-1, hidden_c.size(-1))).to(accumulate)
                grad_hidden = (grad_logits_c @ w).to(accumulate) * (hidden > 0)
                grad_source += grad_hidden.sum(dim=1)
                grad_target[:, start:stop] = grad_hidden.sum(dim=2)
        return (grad_source.to(source_hidden.dtype), grad_target.to(target_hidden.dtype),
                grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype), None, None, None)


#: inference on the CPU: lexicon rows (one (i, j) pair each) per block, so that the (rows, V)
#: logits of a block stay in the core's cache through the normalizer's passes over them
#: (whole extraction 1.72x faster with it and the explicit forward–backward:
#: eval/results/extract_speed.md)
CPU_BLOCK_ROWS = 128


def _lexicon_inference_cpu(source_hidden: torch.Tensor, target_hidden: torch.Tensor,
                           weight: torch.Tensor, bias: Optional[torch.Tensor],
                           targets: torch.Tensor, block_rows: int = CPU_BLOCK_ROWS
                           ) -> torch.Tensor:
    """log p_lex(e_i | j) (B, I, J) without autograd, cache-blocked for the CPU.

    Per target position i: the hidden rows relu(W5·h_j + W6·s_i) of all (b, j), with a
    constant 1 appended so that the bias is one more column of W4 (no separate pass to add
    it); then blocks of ``block_rows`` rows: logits (rows, V) -> log Σ_v exp. The observed
    word's logit is a dot product per row. Same values as :func:`_lexicon_chunk` with ε = 0
    (to float rounding).
    """
    batch, states, dim = source_hidden.shape
    steps = target_hidden.size(1)
    weight = weight.float()
    bias = torch.zeros(weight.size(0)) if bias is None else bias.float()
    weight_bias = torch.cat([weight, bias.unsqueeze(1)], dim=1).t().contiguous()  # (k+1, V)
    hidden = torch.empty(batch, states, dim + 1)
    hidden[..., dim] = 1.0
    scores = torch.empty(batch, steps, states)
    log_norm = torch.empty(batch * states)
    source, target = source_hidden.float(), target_hidden.float()
    for i in range(steps):
        torch.clamp_min(source + target[:, i:i + 1], 0.0, out=hidden[..., :dim])
        rows = hidden.view(batch * states, dim + 1)
        for start in range(0, rows.size(0), block_rows):
            logits = rows[start:start + block_rows] @ weight_bias                 # (r, V)
            top = logits.amax(dim=-1, keepdim=True)
            log_norm[start:start + block_rows] = (
                logits.sub_(top).exp_().sum(dim=-1).log_().add_(top.squeeze(-1)))
        observed = weight_bias.t()[targets[:, i]]                                  # (B, k+1)
        scores[:, i] = (torch.einsum("bjk,bk->bj", hidden, observed)
                        - log_norm.view(batch, states))
    return scores


#: the linear lexicon's factored normalizer Σ_v exp(a_iv − m_i)·exp(b_jv − n_j) below this is
#: recomputed directly (a float32 sum this small has lost precision or underflowed to 0)
LINEAR_LEXICON_FLOOR = 1e-20
#: on a GPU (no host sync per forward): how many of a batch's smallest normalizers the linear
#: lexicon recomputes directly, where they are below LINEAR_LEXICON_FLOOR (each costs one
#: logsumexp over the vocabulary: 1024 rows of a 10k vocabulary, 40 MB of float32 logits)
LINEAR_LEXICON_FALLBACK_ROWS = 1024


def _direct_log_norm(source_hidden: torch.Tensor, target_hidden: torch.Tensor,
                     weight: torch.Tensor, bias: Optional[torch.Tensor], batch: torch.Tensor,
                     step: torch.Tensor, state: torch.Tensor, accumulate: torch.dtype,
                     excluded: Optional[torch.Tensor] = None) -> torch.Tensor:
    """log Σ_v exp(logit(v | i, j)) of the (batch, step, state) entries, by a direct logsumexp
    (the logits again, for these (i, j) only: the parts may have been overwritten); the words
    `excluded` (B, V) of a sentence are left out of its sum."""
    target_rows = F.linear(target_hidden[batch, step], weight, bias).to(accumulate)
    if excluded is not None:
        target_rows = target_rows.masked_fill(excluded[batch], float("-inf"))
    source_rows = F.linear(source_hidden[batch, state], weight).to(accumulate)
    return torch.logsumexp(target_rows + source_rows, dim=-1)


def _fixed_fallback(log_norm: torch.Tensor, norm: torch.Tensor, far: torch.Tensor,
                    source_hidden: torch.Tensor, target_hidden: torch.Tensor,
                    weight: torch.Tensor, bias: Optional[torch.Tensor],
                    accumulate: torch.dtype, rows: int,
                    excluded: Optional[torch.Tensor] = None) -> torch.Tensor:
    """log_norm with its entries below the floor recomputed directly, in tensors whose shapes
    depend on the input's shape only (no ``nonzero()``, no ``bool()`` of a device tensor: a
    GPU runs it without the host waiting): the `rows` smallest normalizers (topk of a fixed
    size) are recomputed and kept where `far` says so. Every far entry is among them while
    there are at most `rows` of them (a far entry's normalizer is below the floor, every other
    one at or above it)."""
    batch, steps, states = norm.shape
    count = min(int(rows), norm.numel())
    if count <= 0:
        return log_norm
    flat = norm.detach().reshape(-1)
    index = torch.topk(flat, count, largest=False, sorted=False).indices          # (K,)
    b = torch.div(index, steps * states, rounding_mode="floor")
    i = torch.div(index, states, rounding_mode="floor") % steps
    j = index % states
    direct = _direct_log_norm(source_hidden, target_hidden, weight, bias, b, i, j, accumulate,
                              excluded)
    values = torch.where(far.reshape(-1)[index], direct.to(log_norm.dtype),
                         log_norm.reshape(-1)[index])
    # topk's indices are distinct: one write per entry, deterministic
    return log_norm.reshape(-1).index_put((index,), values).view_as(log_norm)



def linear_lexicon_log_probs(source_hidden: torch.Tensor, target_hidden: torch.Tensor,
                             weight: torch.Tensor, bias: Optional[torch.Tensor],
                             targets: torch.Tensor, smoothing: float = 0.0,
                             fallback_rows: Optional[int] = None,
                             excluded: Optional[torch.Tensor] = None) -> torch.Tensor:
    """log p_lex(e_i | j) of the linear lexicon W4·(W5·h_j + W6·s_i) + bias: (B, I, J).

    The logits split into a target and a source part, logit(v | i, j) = a_iv + b_jv with
    a_i = W4·(W6·s_i) + bias (B, I, V) and b_j = W4·(W5·h_j) (B, J, V), so the normalizer of
    every (i, j) is one matrix product of exponentials:
        Z(i, j) = Σ_v exp(a_iv + b_jv) = exp(m_i + n_j) · Σ_v exp(a_iv − m_i) · exp(b_jv − n_j)
    with m_i = max_v a_iv and n_j = max_v b_jv (every factor ≤ 1: nothing overflows; a sum below
    :data:`LINEAR_LEXICON_FLOOR`, where the two maxima fall on unrelated words, is recomputed
    as a direct logsumexp for that (i, j): exact for any logits). Cost per
    sentence (I + J)·V·k + I·J·V multiply-adds, against I·J·V·k for the relu lexicon, and no
    (B, I, J, V) tensor. Plain autograd (the shifts m, n are constants of the gradient: log Z
    does not depend on them).

    Args and result as :func:`lexicon_log_probs` (source_hidden (B, J, k) = W5·h_j with W5's
    bias, target_hidden (B, I, k) = W6·s_i, weight (V, k), targets (B, I), label smoothing ε:
    (1-ε)·log p_lex(e_i|j) + ε·mean_v log p_lex(v|j)); float32 (the matmuls of a and b in the
    autocast dtype when autocast is on, the normalizer's product always in float32; float64
    for float64 inputs).

    fallback_rows: how the (i, j) below the floor are found. None: on the CPU by
    ``nonzero()`` (exact for any logits), elsewhere as with :data:`LINEAR_LEXICON_FALLBACK_ROWS`.
    A number K: without a host sync (fixed shapes, :func:`_fixed_fallback`): the K smallest
    normalizers of the batch are recomputed directly where they are below the floor: exact
    while at most K (i, j) of the batch are (the same values as None); beyond that the rest
    keep the factored value (the floor's sum, log 0 read as log 1: a lexicon whose two
    parts' maxima fall on unrelated words for more than K pairs, which a trained model is not).

    excluded: (B, V) bool or None: words left out of sentence b's normalizers (a per-sentence
    shortlist, :meth:`DirectHMM.log_lexicon`); never one of the sentence's own targets.
    """
    target_part = F.linear(target_hidden, weight, bias)                           # (B, I, V)
    if excluded is not None:   # exp(-inf) = 0: the word adds nothing to the sentence's Z
        target_part = target_part.masked_fill(excluded.unsqueeze(1), float("-inf"))
    source_part = F.linear(source_hidden, weight)                                 # (B, J, V)
    accumulate = torch.promote_types(target_part.dtype, torch.float32)
    target_part, source_part = target_part.to(accumulate), source_part.to(accumulate)
    observed_target = target_part.gather(-1, targets.unsqueeze(-1))                # (B, I, 1)
    observed_source = source_part.transpose(1, 2).gather(
        1, targets.unsqueeze(-1).expand(-1, -1, source_part.size(1)))               # (B, I, J)
    if smoothing > 0.0:
        mean_target = target_part.mean(dim=-1, keepdim=True)                       # (B, I, 1)
        mean_source = source_part.mean(dim=-1).unsqueeze(1)                        # (B, 1, J)
    target_max = target_part.detach().amax(dim=-1, keepdim=True)                   # (B, I, 1)
    source_max = source_part.detach().amax(dim=-1, keepdim=True)                   # (B, J, 1)
    if torch.is_grad_enabled():
        target_exp = (target_part - target_max).exp_()    # exp_ on a fresh tensor: autograd
        source_exp = (source_part - source_max).exp_()    # allows it
    else:   # extraction: the parts are not needed again, shifted and exponentiated in place
        target_exp = target_part.sub_(target_max).exp_()
        source_exp = source_part.sub_(source_max).exp_()
    # the normalizer in float32 also under autocast (bf16 would round each Z(i, j) to 8 bits)
    with torch.autocast(device_type=target_exp.device.type, enabled=False):
        norm = torch.matmul(target_exp, source_exp.transpose(1, 2))                # (B, I, J)
    # Σ_v can be tiny, or 0, when no word is near the top of both a_i and b_j: those (i, j)
    # (rare in a trained model) are summed directly, so the result is exact for any logits
    far = norm < LINEAR_LEXICON_FLOOR
    log_norm = (norm.masked_fill(far, 1.0).log()
                + target_max + source_max.transpose(1, 2))
    if fallback_rows is None and norm.device.type != "cpu":
        fallback_rows = LINEAR_LEXICON_FALLBACK_ROWS
    if fallback_rows is None:   # the CPU: the far (i, j) found on the host, no GPU to wait for
        if bool(far.any()):
            batch, step, state = far.nonzero(as_tuple=True)
            log_norm = log_norm.index_put(
                (batch, step, state), _direct_log_norm(source_hidden, target_hidden, weight,
                                                       bias, batch, step, state, accumulate,
                                                       excluded))
    else:   # fixed shapes: no host sync on a GPU (bool(any()) and nonzero() wait for it)
        log_norm = _fixed_fallback(log_norm, norm, far, source_hidden, target_hidden, weight,
                                   bias, accumulate, fallback_rows, excluded)
    scores = observed_target + observed_source - log_norm
    if smoothing > 0.0:
        uniform = mean_target + mean_source - log_norm
        scores = (1.0 - smoothing) * scores + smoothing * uniform
    return scores


def lexicon_log_probs(source_hidden: torch.Tensor, target_hidden: torch.Tensor,
                      weight: torch.Tensor, bias: Optional[torch.Tensor],
                      targets: torch.Tensor, smoothing: float = 0.0,
                      chunk: int = 0) -> torch.Tensor:
    """log p_lex(e_i | j) = log_softmax(W4·relu(W5·h_j + W6·s_i))[e_i] for all i, j: (B, I, J).

    Args:
        source_hidden: (B, J, k) = W5·h_j (bias included).
        target_hidden: (B, I, k) = W6·s_i.
        weight, bias: W4 as (V, k) and (V,) or None.
        targets: (B, I) the observed words e_i (any id at padded positions).
        smoothing: label smoothing ε of the lexicon (0 = plain log-probability).
        chunk: target positions per chunk. With chunk > 0 (:class:`_ChunkedLexicon`) only the
            (B, chunk, J, V) logits of one chunk exist at a time, in the forward pass and, by
            recomputation, in the backward pass; 0 = plain autograd over the whole tensor
            (the reference; peak memory grows with I·J).
    Returns:
        (B, I, J) float32 scores; the caller masks padding.

    Without autograd on the CPU (fp32, ε = 0: extraction) the cache-blocked
    :func:`_lexicon_inference_cpu` computes the same values; `chunk` is then irrelevant.
    """
    if (not torch.is_grad_enabled() and smoothing == 0.0 and weight.device.type == "cpu"
            and not torch.is_autocast_enabled("cpu") and weight.dtype == torch.float32):
        return _lexicon_inference_cpu(source_hidden, target_hidden, weight, bias, targets)
    if chunk <= 0:
        return _lexicon_chunk(source_hidden, target_hidden, weight, bias, targets, smoothing)
    return _ChunkedLexicon.apply(source_hidden, target_hidden, weight, bias, targets,
                                 float(smoothing), int(chunk))


#: decoding: most lexicon logits (floats) one step computes at a time, in chunks of source
#: positions (a chunk never has fewer than one position: N · V floats for N beam rows)
LEXICON_CHUNK_FLOATS = 1 << 22


def mixture_log_probs(log_prior: torch.Tensor, source_hidden: torch.Tensor,
                      target_hidden: torch.Tensor, weight: torch.Tensor,
                      bias: Optional[torch.Tensor], positions: int, activation: str = "relu"
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The direct HMM's word distribution at one target position, source positions chunked.

    log p(v) = logsumexp_j (log π(j) + log p_lex(v|j)) with
    log p_lex(v|j) = logit(v|j) − log Σ_v' exp(logit(v'|j)), logits of :func:`lexicon_logits`.

    Args:
        log_prior: (N, J+1) log π(j) (−inf at padded positions), float32.
        source_hidden: (N, J+1, k) W5·h_j; target_hidden: (N, k) W6·s of the newest position.
        weight, bias: W4 (V, k) and its bias (V,) or None.
        positions: source positions per chunk (>= 1): only (N, positions, V) logits exist at
            a time; the chunks are combined by a running logsumexp.
        activation: the lexicon's (:func:`lexicon_logits`).
    Returns:
        (log p (N, V), log normalizers log Σ_v exp(logit(v|j)) (N, J+1)), float32.
    """
    total: Optional[torch.Tensor] = None
    norms = []
    for start in range(0, log_prior.size(1), positions):
        stop = start + positions
        _, logits = lexicon_logits(source_hidden[:, start:stop], target_hidden[:, None, :],
                                   weight, bias, activation=activation)
        logits = logits.float()                                                    # (N, c, V)
        log_norm = torch.logsumexp(logits, dim=-1)                                 # (N, c)
        logits += (log_prior[:, start:stop] - log_norm)[:, :, None]   # log π + log p_lex
        part = torch.logsumexp(logits, dim=1)                                      # (N, V)
        total = part if total is None else torch.logaddexp(total, part)
        norms.append(log_norm)
    assert total is not None, "no source positions"
    return total, torch.cat(norms, dim=1)


def empty_word_mixture(log_lexicon: torch.Tensor, gate: torch.Tensor
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The empty word's gated mixture (``DirectHMMConfig.null_word``): (log emission, log link
    part), both (..., J+1).

    log_lexicon (..., J+2): log p_lex(e | j) of the J+1 positions, the empty word's last;
    gate (..., 1): the logit of p0. link part = log(1 − p0) + log p_lex(e | j), emission =
    logaddexp(link part, log p0 + log p_lex(e | ∅)).
    """
    link = log_lexicon[..., :-1] + F.logsigmoid(-gate)
    return torch.logaddexp(link, log_lexicon[..., -1:] + F.logsigmoid(gate)), link


# -- layers ----------------------------------------------------------------------------------

@contextlib.contextmanager
def _float32_on_cpu_inference(tensor: torch.Tensor) -> Iterator[bool]:
    """Yields True, with autocast off inside, where `tensor` is a reduced-precision CPU tensor
    outside autocast's training use (no autograd): there the context's (B, I, H, J, d/H)
    features are faster in float32 (the CPU has no bfloat16 element-wise arithmetic: each
    operation converts; eval/results/extract_speed_bf16.md), and more exact. Elsewhere (a GPU,
    training, float32 inputs) yields False and changes nothing."""
    if (tensor.device.type == "cpu" and tensor.dtype != torch.float32
            and not torch.is_grad_enabled()):
        with torch.autocast(device_type="cpu", enabled=False):
            yield True
    else:
        yield False


class HMMContext(nn.Module):
    """c_i = W1 · Σ_j α_h(j|i) · relu(W2·h_j + W3·s_i) per head h (replaces cross-attention).

    ``forward(s (B, I, d), memory (B, J, d), src_pad_mask (B, J) True = pad)`` ->
    ``(context (B, I, d), α (B, H, I, J))``. Holds a (B, I, H, J, d/H) feature tensor.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.w1 = nn.Linear(d_model, d_model)
        self.w2 = nn.Linear(d_model, d_model)
        self.w3 = nn.Linear(d_model, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, s: torch.Tensor, memory: torch.Tensor, src_pad_mask: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        batch, steps, d_model = s.shape
        states = memory.size(1)
        q = self.query(s).view(batch, steps, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.key(memory).view(batch, states, self.n_heads, self.head_dim).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)           # (B, H, I, J)
        scores = scores.masked_fill(src_pad_mask[:, None, None, :], float("-inf"))
        alpha = torch.softmax(scores.float(), dim=-1).to(s.dtype)
        # the features are built in the layout of the matrix product, (B, I, H, J, d/H), so
        # that the α-weighted sum over j is one batched product without a permuted copy
        heads, head_dim = self.n_heads, self.head_dim
        # (a contiguous source, or the broadcast sum inherits its transposed layout)
        source = self.w2(memory).view(batch, states, heads, head_dim).transpose(1, 2).contiguous()
        target = self.w3(s).view(batch, steps, heads, 1, head_dim)
        weights = self.dropout(alpha).transpose(1, 2).unsqueeze(3)         # (B, I, H, 1, J)
        dtype = source.dtype
        with _float32_on_cpu_inference(source) as float32:
            if float32:   # the CPU emulates bfloat16 element-wise arithmetic: 2x slower
                source, target, weights = source.float(), target.float(), weights.float()
            features = F.relu(source.unsqueeze(1) + target, inplace=True)  # (B, I, H, J, d/H)
            context = torch.matmul(weights, features)                      # (B, I, H, 1, d/H)
        return self.w1(context.reshape(batch, steps, d_model).to(dtype)), alpha


class HMMDecoderLayer(nn.Module):
    """Pre-norm: x + SelfAttn(LN(x)); then x = HMMContext(LN(x)) (no residual; with
    ``config.context == "attention"``: x + CrossAttn(LN(x)), the transformer's); x + FF(LN(x)).

    ``forward(x (B, I+1, d), memory (B, J+1, d), tgt_pad_mask, src_pad_mask, history)`` ->
    (B, I+1, d); ``history``: see aligner.models.transformer.decoder_self_attention (Markov).
    """

    def __init__(self, config: DirectHMMConfig):
        super().__init__()
        self.markov_order = config.markov_order
        self.norm_self = nn.LayerNorm(config.d_model)
        self.self_attn = MultiHeadAttention(config.d_model, config.n_heads, config.dropout)
        self.norm_context = nn.LayerNorm(config.d_model)
        self.residual_context = config.context == "attention"
        if self.residual_context:
            self.cross_attn = MultiHeadAttention(config.d_model, config.n_heads, config.dropout)
        else:
            self.context = HMMContext(config.d_model, config.n_heads, config.dropout)
        self.norm_ff = nn.LayerNorm(config.d_model)
        self.ff = FeedForward(config.d_model, config.d_ff, config.dropout)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, tgt_pad_mask: torch.Tensor,
                src_pad_mask: torch.Tensor, history: Optional[torch.Tensor] = None
                ) -> torch.Tensor:
        attended = decoder_self_attention(self.self_attn, self.norm_self, x, tgt_pad_mask,
                                          history, self.markov_order)
        x = x + self.dropout(attended)
        if self.residual_context:
            context, _ = self.cross_attn(self.norm_context(x), memory,
                                         key_padding_mask=src_pad_mask)
            x = x + self.dropout(context)
        else:
            context, _ = self.context(self.norm_context(x), memory, src_pad_mask)
            x = self.dropout(context)
        return x + self.dropout(self.ff(self.norm_ff(x)))


def _contiguous_gradient(gradient: torch.Tensor) -> torch.Tensor:
    """The keys' gradient in the keys' own layout. :meth:`FirstOrderAlignment.log_probs`
    multiplies by the keys transposed, (B, a, (J+1)·J), so autograd hands the keys a
    transposed view of a (B, a, (J+1)·J) tensor; the relu's backward over that view and the
    contiguous keys reads one of the two a stride of (J+1)·J floats apart (each element a new
    cache line): over twice the time of a transposing copy followed by the contiguous
    backward. The values are the same (a copy, then an elementwise select; the relu
    backward's output is contiguous either way), so training gives the same weights bit for
    bit."""
    return gradient.contiguous()


class FirstOrderAlignment(nn.Module):
    """log α(j | i, j') for j' in {start, 0..J-1}: (B, I, J+1, J) with the start state at j'=0.

    score(i, j', j) = q_i · W_o·relu(W_a·h_j + W_b·h_j' + D[clip(j - j', ±max_jump)]) / √a,
    q_i = W_q·s_i^(L-1); the start state uses a learned vector for h_j' and position j' = -1.
    Softmax over j; padded source positions j get α = 0 (log α = -inf). The features have
    width a = `dim` (0 = d_model): W_q, W_a, W_b map d_model -> a; W_o and D are a-wide.

    Computed as (W_oᵀ·q_i) · relu(...) + q_i·b_o: W_o moves to the I queries instead of the
    J·(J+1) keys per sentence (I·a² instead of J²·a² multiply-adds, the same value to float
    rounding), so :meth:`keys` returns the relu features and :meth:`queries` the projected
    queries with their bias term. The bias term q_i·b_o is the same for every j and cancels
    in the softmax over j: without autograd (extraction, decoding) it is left out; training
    keeps it so that every parameter has a gradient, as DistributedDataParallel expects.
    """

    def __init__(self, d_model: int, max_jump: int, dim: int = 0):
        super().__init__()
        dim = dim or d_model
        self.max_jump = max_jump
        self.query = nn.Linear(d_model, dim)
        self.w_a = nn.Linear(d_model, dim)
        self.w_b = nn.Linear(d_model, dim, bias=False)
        self.w_o = nn.Linear(dim, dim)
        self.start = nn.Parameter(torch.zeros(d_model))
        self.jump = nn.Embedding(2 * max_jump + 1, dim)
        nn.init.normal_(self.start, std=d_model ** -0.5)
        nn.init.normal_(self.jump.weight, std=dim ** -0.5)

    def keys(self, memory: torch.Tensor) -> torch.Tensor:
        """relu(W_a·h_j + W_b·h_j' + D[jump]): (B, J+1, J, a), previous state j' (start
        first) by state j. Depends on the source only, so a decoder computes it once per
        sentence (aligner.translate) instead of once per output position."""
        batch, states, d_model = memory.shape
        previous = torch.cat([self.start.expand(batch, 1, d_model).to(memory.dtype), memory], 1)
        position = torch.arange(states, device=memory.device)
        previous_position = torch.arange(-1, states, device=memory.device)
        jump = (position.unsqueeze(0) - previous_position.unsqueeze(1)).clamp(
            -self.max_jump, self.max_jump) + self.max_jump                       # (J+1, J)
        hidden = self.w_a(memory).unsqueeze(1) + self.w_b(previous).unsqueeze(2)
        hidden += self.jump(jump).to(hidden.dtype)   # (B, J+1, J, a); hidden is bf16 under autocast
        keys = F.relu(hidden, inplace=True)                 # in place: one (B, J+1, J, a) buffer
        if keys.requires_grad:
            keys.register_hook(_contiguous_gradient)
        return keys

    def queries(self, s_prev: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """s_prev (B, I, d) -> (W_oᵀ·W_q·s (B, I, a), bias term (W_q·s)·b_o (B, I)); the bias
        term is None without autograd (it cancels in the softmax, see the class docstring)."""
        query = self.query(s_prev)
        projected = query @ self.w_o.weight.to(query.dtype)
        if not torch.is_grad_enabled():
            return projected, None
        return projected, query @ self.w_o.bias.to(query.dtype)

    def forward(self, s_prev: torch.Tensor, memory: torch.Tensor, src_pad_mask: torch.Tensor,
                keys: Optional[torch.Tensor] = None) -> torch.Tensor:
        """s_prev (B, I, d), memory (B, J, d), src_pad_mask (B, J); keys: ``self.keys(memory)``
        when already computed. Returns log α (B, I, J+1, J)."""
        keys = self.keys(memory) if keys is None else keys
        return self.log_probs(*self.queries(s_prev), keys, src_pad_mask)

    @staticmethod
    def log_probs(queries: torch.Tensor, offsets: Optional[torch.Tensor], keys: torch.Tensor,
                  src_pad_mask: torch.Tensor, log: bool = True) -> torch.Tensor:
        """log α (B, c, J+1, J) of c target positions from their :meth:`queries` (B, c, a) and
        bias terms (B, c) or None, and ``keys(memory)`` (B, J+1, J, a): one batched matrix
        product (B, c, a) x (B, a, (J+1)·J) with the bias and the 1/√a scale fused in (a: the
        feature width, ``alignment_dim`` or d_model).
        ``log=False``: α itself (a softmax instead of log_softmax, then exp)."""
        batch, steps, dim = queries.shape
        previous, states = keys.size(1), keys.size(2)
        scale = 1.0 / math.sqrt(dim)
        flat_keys = keys.reshape(batch, previous * states, dim).transpose(1, 2)
        if offsets is None:   # the scale on the (B, c, a) queries, not the (B, c, J+1, J) scores
            scores = torch.bmm(queries * scale, flat_keys)
        else:
            scores = torch.baddbmm((offsets * scale).unsqueeze(-1), queries, flat_keys,
                                   alpha=scale)
        scores = scores.view(batch, steps, previous, states)           # a new tensor: in place
        scores.masked_fill_(src_pad_mask[:, None, None, :], float("-inf"))
        # at least float32 (a bf16 product under autocast is converted inside the softmax)
        dtype = torch.promote_types(scores.dtype, torch.float32)
        return (torch.log_softmax(scores, dim=-1, dtype=dtype) if log
                else torch.softmax(scores, dim=-1, dtype=dtype))


@dataclass
class FirstOrderScores:
    """First-order alignment log α(j | i, j') computed on demand for spans of target positions.

    The whole (B, I+1, J+2, J+1) tensor grows with the cube of the sentence length; the
    forward–backward and Viterbi algorithms (aligner/models/hmm_algorithms.py) take
    :meth:`transitions` as a ``TransitionFn`` and ask for ``chunk`` positions at a time.
    """

    queries: torch.Tensor        # (B, I+1, a) W_oᵀ·W_q·s_i^(L-1)
    offsets: Optional[torch.Tensor]  # (B, I+1) (W_q·s_i^(L-1))·b_o; None without autograd
    keys: torch.Tensor           # (B, J+2, J+1, a) FirstOrderAlignment.keys(memory)
    src_pad_mask: torch.Tensor   # (B, J+1) True at padding

    def __call__(self, start: int, stop: int, log: bool = True) -> torch.Tensor:
        """log α of target positions start..stop-1: (B, stop-start, J+2, J+1), start state
        first (``log=False``: α)."""
        offsets = None if self.offsets is None else self.offsets[:, start:stop]
        return FirstOrderAlignment.log_probs(self.queries[:, start:stop], offsets, self.keys,
                                             self.src_pad_mask, log)

    def log_initial(self) -> torch.Tensor:
        """log α(j | 0, start): (B, J+1)."""
        return self(0, 1)[:, 0, 0]

    def transitions(self, start: int, stop: int) -> torch.Tensor:
        """log α(j | i, j') for i in start..stop-1 and real previous states j':
        (B, c, J+1, J+1)."""
        return self(start, stop)[:, :, 1:]

    def transition_probs(self, start: int, stop: int) -> torch.Tensor:
        """α(j | i, j') = exp of :meth:`transitions`, computed as a softmax: (B, c, J+1, J+1)."""
        return self(start, stop, log=False)[:, :, 1:]

    def chunk(self, floats: int) -> Optional[int]:
        """Target positions per chunk for a budget of `floats` (None: all at once)."""
        batch, states = self.keys.size(0), self.keys.size(2)
        per_position = batch * (states + 1) * states
        if floats <= 0 or per_position * self.queries.size(1) <= floats:
            return None
        return max(1, floats // per_position)


class HMMOutputLayer(nn.Module):
    """Last decoder layer: causal self-attention, then lexicon features and alignment.

    ``forward(x (B, I+1, d), memory (B, J+1, d), tgt_pad_mask, src_pad_mask, history)`` ->
    ``(log α, source_hidden (B, J+1, k) = W5·h, target_hidden (B, I+1, k) = W6·s^(L))`` where
    log α is (B, I+1, J+1) for order 0 and (B, I+1, J+2, J+1) (start state first) for order 1.
    """

    def __init__(self, config: DirectHMMConfig, order: int):
        super().__init__()
        d_model = config.d_model
        self.order = order
        self.markov_order = config.markov_order
        self.norm_self = nn.LayerNorm(d_model)
        self.self_attn = MultiHeadAttention(d_model, config.n_heads, config.dropout)
        self.norm_out = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(config.dropout)
        lexicon_dim = config.lexicon_dim or d_model
        self.w5 = nn.Linear(d_model, lexicon_dim)
        self.w6 = nn.Linear(d_model, lexicon_dim, bias=False)
        if order == 0:
            self.align_query = nn.Linear(d_model, d_model)
            self.align_key = nn.Linear(d_model, d_model)
        else:
            self.norm_prev = nn.LayerNorm(d_model)
            self.first_order = FirstOrderAlignment(d_model, config.max_jump,
                                                   config.alignment_dim)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, tgt_pad_mask: torch.Tensor,
                src_pad_mask: torch.Tensor, history: Optional[torch.Tensor] = None,
                alignment_keys: Optional[torch.Tensor] = None, lazy: bool = False
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``lazy`` (order 1): return log α as :class:`FirstOrderScores`, not as a tensor."""
        if self.order == 1 and lazy:
            keys = self.first_order.keys(memory) if alignment_keys is None else alignment_keys
            log_alpha = FirstOrderScores(*self.first_order.queries(self.norm_prev(x)), keys,
                                         src_pad_mask)
        elif self.order == 1:   # alignment_keys: first_order.keys(memory), cached by a decoder
            log_alpha = self.first_order(self.norm_prev(x), memory, src_pad_mask,
                                         alignment_keys)
        attended = decoder_self_attention(self.self_attn, self.norm_self, x, tgt_pad_mask,
                                          history, self.markov_order)
        s = self.norm_out(x + self.dropout(attended))                           # s_i^(L)
        if self.order == 0:
            scores = self.align_query(s) @ self.align_key(memory).transpose(1, 2)
            scores = scores.float() / math.sqrt(s.size(-1))
            scores = scores.masked_fill(src_pad_mask[:, None, :], float("-inf"))
            log_alpha = torch.log_softmax(scores, dim=-1)                       # (B, I+1, J+1)
        return log_alpha, self.w5(memory), self.w6(self.dropout(s))


# -- the models ------------------------------------------------------------------------------

class DirectHMM(AlignmentModel):
    """Shared body of hmm0 and hmm1 (the subclasses fix ``order`` and ``METHODS``)."""

    order = 0
    config_class = DirectHMMConfig
    #: averaging the directions' posteriors beats every Moses heuristic (enfr_hmm1.md: 8.0 vs
    #: grow-diag 15.9 on en-fr dev; enfr_hmm0.md)
    BEST_HEURISTIC = "soft-average"
    #: hmm0 and hmm1 implement training_terms (guided and agreement training)
    TRAINS_POSTERIOR = True
    #: the methods that read the lexicon (:meth:`log_lexicon`)
    SHORTLIST_METHODS = ("hmm-posterior", "hmm-viterbi")

    def __init__(self, config: DirectHMMConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.embed = Embedding(config.tgt_vocab_size, config.d_model, config.max_positions,
                               config.dropout)
        self.layers = nn.ModuleList(HMMDecoderLayer(config)
                                    for _ in range(config.dec_layers - 1))
        self.output_layer = HMMOutputLayer(config, self.order)
        lexicon_dim = config.lexicon_dim or config.d_model
        self.lexicon = nn.Linear(lexicon_dim, config.tgt_vocab_size)             # W4
        if config.tie_embeddings and lexicon_dim == config.d_model:
            self.lexicon.weight = self.embed.token.weight
        else:
            nn.init.normal_(self.lexicon.weight, mean=0.0, std=lexicon_dim ** -0.5)
        if config.null_word:   # the empty word's W5·h (k,) and its gate p0_i = σ(w·W6·s_i + b)
            self.null_source = nn.Parameter(torch.randn(lexicon_dim) * lexicon_dim ** -0.5)
            self.null_gate = nn.Linear(lexicon_dim, 1)
            nn.init.zeros_(self.null_gate.weight)
            nn.init.constant_(self.null_gate.bias, NULL_GATE_BIAS)

    def leaves_unaligned_mass(self, method: str) -> bool:
        """With the empty word, ``hmm-posterior`` rows sum to p(aligned) < 1 (the rest: the
        empty word and the source EOS state), and extraction keeps that (the contract of
        aligner/models/base.py)."""
        return self.config.null_word and method == "hmm-posterior"

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """src (B, J+1) -> memory h (B, J+1, d)."""
        return self.encoder(src)

    def decode(self, src: torch.Tensor, tgt_in: torch.Tensor, lazy: bool = False
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log α, W5·h (B, J+1, d), W6·s (B, I+1, d)); log α as in :class:`HMMOutputLayer`
        (``lazy``, first order: a :class:`FirstOrderScores`)."""
        return self._decoder(self.encode(src), src, tgt_in, lazy=lazy)

    def _decoder(self, memory: torch.Tensor, src: torch.Tensor, tgt_in: torch.Tensor,
                 state: Optional[DecodeState] = None, lazy: bool = False
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decoder layers and the output layer on tgt_in, as :meth:`decode` returns them.

        With a decoding ``state`` tgt_in holds the newest positions only, starting at
        ``state["position"]``; their layer inputs are appended to the state's history (in
        place) and hmm1 reads the state's ``alignment_keys``.
        """
        tgt_pad_mask, src_pad_mask = tgt_in.eq(PAD_ID), src.eq(PAD_ID)
        x = self.embed(tgt_in, offset=0 if state is None else state["position"])
        static = static_history(x, self.config.markov_order, state)  # Markov: static keys
        for index, layer in enumerate(self.layers):
            x = layer(x, memory, tgt_pad_mask, src_pad_mask, layer_history(state, index, x,
                                                                             static))
        history = layer_history(state, len(self.layers), x, static)
        keys = None if state is None else state.get("alignment_keys")
        return self.output_layer(x, memory, tgt_pad_mask, src_pad_mask, history, keys,
                                 lazy=lazy)

    # -- incremental decoding (see the module docstring) -------------------------------------
    def init_decode_state(self, src: torch.Tensor,
                          lexicon_floats: int = LEXICON_CHUNK_FLOATS) -> DecodeState:
        """Encoded sources, the sources, the empty layer history (and hmm1's alignment keys).

        ``lexicon_floats``: most lexicon logits one step holds at a time (see
        :func:`mixture_log_probs`): source positions per chunk = max(1, lexicon_floats //
        (N · V)) for N rows and V words. Same distribution for every value.
        """
        check_condition(lexicon_floats >= 1,
                        f"lexicon_floats must be >= 1 (got {lexicon_floats})")
        memory = self.encode(src)
        state = {"memory": memory, "src": src, "lexicon_floats": int(lexicon_floats)}
        if self.order == 1:
            state["alignment_keys"] = self.output_layer.first_order.keys(memory)
        return init_decoder_history(state, memory, len(self.layers) + 1,
                                    self.config.markov_order)

    def decode_position(self, state: DecodeState, prev_tokens: torch.Tensor
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decoder on the newest tokens prev_tokens (N,): log α of that position ((N, J+1);
        hmm1 (N, J+2, J+1), the start state first), W5·h (N, J+1, k) and W6·s (N, k).

        Appends the position to ``state``'s history and advances its position, in place.
        """
        log_alpha, source_hidden, target_hidden = self._decoder(
            state["memory"], state["src"], prev_tokens[:, None], state)
        state["position"] += 1
        return log_alpha[:, -1], source_hidden, target_hidden[:, -1]

    def decode_prior(self, log_alpha: torch.Tensor, state: DecodeState,
                     prev_tokens: torch.Tensor) -> torch.Tensor:
        """log π(j) (N, J+1) of the newest position from its log α (:meth:`decode_position`)."""
        raise NotImplementedError

    def decode_step(self, state: DecodeState, prev_tokens: torch.Tensor
                    ) -> Tuple[torch.Tensor, DecodeState]:
        """log p(e) = log Σ_j π(j) · p_lex(e|j) (N, V) float32, the lexicon in chunks of
        source positions (:func:`mixture_log_probs`). With the empty word
        Σ_j π(j)·[(1 − p0)·p_lex(e|j) + p0·p_lex(e|∅)] = Σ_j (1 − p0)·π(j)·p_lex(e|j) +
        p0·p_lex(e|∅): the empty word is one more position, of prior p0."""
        state = next_decode_state(state)
        log_alpha, source_hidden, target_hidden = self.decode_position(state, prev_tokens)
        log_prior = self.decode_prior(log_alpha, state, prev_tokens)
        rows = log_prior.size(0)
        positions = max(1, state["lexicon_floats"]
                        // max(1, rows * self.config.tgt_vocab_size))
        mixture_prior, gate = log_prior, None
        if self.config.null_word:
            gate = self.null_gate(target_hidden).float()                           # (N, 1)
            mixture_prior = torch.cat([log_prior + F.logsigmoid(-gate), F.logsigmoid(gate)],
                                      dim=1)
            source_hidden = torch.cat([source_hidden, self.null_source.to(
                source_hidden.dtype).expand(rows, 1, -1)], dim=1)                 # (N, J+2, k)
        log_p, log_norm = mixture_log_probs(mixture_prior, source_hidden, target_hidden,
                                            self.lexicon.weight, self.lexicon.bias, positions,
                                            self.config.lexicon_activation)
        if self.order == 1:
            # what the next step needs for the forward state of the word chosen here
            state["pending"] = (log_prior, log_norm, source_hidden, target_hidden, gate)
        return log_p, state

    def log_lexicon(self, source_hidden: torch.Tensor, target_hidden: torch.Tensor,
                    tgt_out: torch.Tensor, smoothing: float = 0.0,
                    shortlist: int = 0) -> torch.Tensor:
        """(B, I+1, J+1) log p_lex(tgt_out[i] | j), chunked by ``config.lexicon_chunk``.

        In training mode with ``config.lexicon_sample`` > 0 the softmax runs over the sampled
        candidate words of :meth:`candidate_words` only (an approximation of the normalizer).
        ``shortlist`` > 0 (extraction option): the softmax of a sentence runs over the
        ``shortlist`` most frequent words (vocabulary ids are in frequency order) plus the
        sentence's own target words only — an approximation that costs about ``shortlist``/V of
        the exact lexicon, the same for a sentence whatever else is in its batch (the linear
        lexicon; the relu lexicon's runs over the batch's words). With
        ``config.lexicon_activation == "linear"`` the (candidate or whole) vocabulary goes to
        :func:`linear_lexicon_log_probs` (no chunks: it never holds (B, I, J, V)).
        """
        weight, bias, targets = self.lexicon.weight, self.lexicon.bias, tgt_out
        excluded = None
        if self.training and self.config.lexicon_sample > 0:
            candidates = self.candidate_words(tgt_out)
            weight, bias = weight[candidates], bias[candidates]
            targets = torch.searchsorted(candidates, tgt_out)
        elif 0 < shortlist < weight.size(0):
            candidates = torch.unique(torch.cat([
                torch.arange(shortlist, device=tgt_out.device), tgt_out.flatten()]))
            weight, bias = weight[candidates], None if bias is None else bias[candidates]
            targets = torch.searchsorted(candidates, tgt_out)
            # (B, C): a candidate beyond the shortlist that is not one of sentence b's words
            own = torch.zeros(tgt_out.size(0), candidates.numel(), dtype=torch.bool,
                              device=tgt_out.device)
            own.scatter_(1, targets, True)
            excluded = ~own & (candidates >= shortlist).unsqueeze(0)
        if self.config.lexicon_activation == "linear":
            return linear_lexicon_log_probs(source_hidden, target_hidden, weight, bias, targets,
                                            smoothing, excluded=excluded)
        chunk = self.config.lexicon_chunk
        if not torch.is_grad_enabled() and chunk > 0 and self.config.chunk_floats > 0:
            # inference: as many positions as the float budget allows (B·J·V floats each)
            per_position = source_hidden.size(0) * source_hidden.size(1) * weight.size(0)
            chunk = max(1, self.config.chunk_floats // per_position)
        return lexicon_log_probs(source_hidden, target_hidden, weight, bias, targets, smoothing,
                                 chunk)

    def candidate_words(self, tgt_out: torch.Tensor) -> torch.Tensor:
        """Sorted candidate word ids (C,): every id in ``tgt_out`` plus uniformly drawn other
        ids up to ``config.lexicon_sample`` in all (C >= number of distinct observed ids)."""
        vocab_size = self.lexicon.weight.size(0)
        observed = torch.unique(tgt_out)
        missing = self.config.lexicon_sample - observed.numel()
        if missing > 0:
            seen = torch.zeros(vocab_size, dtype=torch.bool, device=tgt_out.device)
            seen[observed] = True
            order = torch.randperm(vocab_size, device=tgt_out.device)
            observed = torch.cat([observed, order[~seen[order]][:missing]])
        return observed.sort().values

    def scores(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
               smoothing: float = 0.0, lazy: bool = False, shortlist: int = 0
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log α, log emission, log link part), the last two (B, I+1, J+1), of a batch
        (``lazy``: see :meth:`decode`; ``shortlist``: see :meth:`log_lexicon`; the emission
        and its link part: :meth:`emissions`)."""
        log_alpha, source_hidden, target_hidden = self.decode(src, tgt_in, lazy)
        return (log_alpha,) + self.emissions(source_hidden, target_hidden, tgt_out, smoothing,
                                             shortlist)

    def emissions(self, source_hidden: torch.Tensor, target_hidden: torch.Tensor,
                  tgt_out: torch.Tensor, smoothing: float = 0.0, shortlist: int = 0
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(log p(e_i | state j), its link part), both (B, I+1, J+1).

        Without the empty word both are log p̃_lex(e_i | j) (the same tensor). With it
        (``config.null_word``) the link part is log(1 − p0_i) + log p̃_lex(e_i | j) and the
        emission logaddexp(link part, log p0_i + log p̃_lex(e_i | ∅)): the lexicon runs on
        the J+1 source positions plus the empty word's vector as one more column.
        Posteriors of links are gradients of log Z with respect to the link part.
        """
        if not self.config.null_word:
            log_lexicon = self.log_lexicon(source_hidden, target_hidden, tgt_out, smoothing,
                                           shortlist)
            return log_lexicon, log_lexicon
        null = self.null_source.to(source_hidden.dtype).expand(source_hidden.size(0), 1, -1)
        log_lexicon = self.log_lexicon(torch.cat([source_hidden, null], dim=1), target_hidden,
                                       tgt_out, smoothing, shortlist)        # (B, I+1, J+2)
        return empty_word_mixture(log_lexicon, self.null_gate(target_hidden).float())

    def loss(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
             label_smoothing: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
        """The NLL of :meth:`training_terms` and the target token count."""
        loss, tokens, _ = self.training_terms(src, tgt_in, tgt_out, label_smoothing)
        return loss, tokens

    def _check_method(self, method: str, options) -> int:
        """Validate `method` and its options; returns the lexicon shortlist (0 = exact).

        The methods that read the lexicon (``hmm-posterior``, ``hmm-viterbi``) take the option
        ``shortlist`` (see :meth:`log_lexicon`); nothing else takes options.
        """
        check_condition(method in self.METHODS,
                        f"unknown method '{method}' for model kind hmm{self.order} "
                        f"(choose from {', '.join(self.METHODS)})")
        allowed = {"shortlist"} if method in self.SHORTLIST_METHODS else set()
        unknown = sorted(set(options) - allowed)
        check_condition(not unknown, f"method '{method}' takes no option "
                                     f"{', '.join(unknown)}"
                                     + (" (only shortlist)" if allowed else ""))
        shortlist = options.get("shortlist", 0)
        check_condition(isinstance(shortlist, int) and shortlist >= 0,
                        f"shortlist must be an integer >= 0 (0 = exact), not {shortlist!r}")
        return shortlist


class ZeroOrderHMM(DirectHMM):
    """Zero-order direct HMM (``align train --model hmm0``)."""

    METHODS: Tuple[str, ...] = ("hmm-posterior", "hmm-alignment")
    order = 0

    def training_terms(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                       label_smoothing: float = 0.0, posterior: bool = False
                       ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """−Σ_i log Σ_j α(j|i)·p̃_lex(e_i|j) over non-pad target tokens, their count, and (with
        ``posterior``) log p(j | e_i, e_<i, f) ∝ α(j|i)·p̃_lex(e_i|j) (B, I+1, J+1), the
        distribution ``hmm-posterior`` extracts, differentiable (a log-softmax)."""
        log_alpha, log_emission, log_link = self.scores(src, tgt_in, tgt_out, label_smoothing)
        log_likelihood = hmm_algorithms.zero_order_log_likelihood(
            log_alpha, log_emission, src.ne(PAD_ID))                             # (B, I+1)
        target_mask = tgt_out.ne(PAD_ID)
        nll = -(log_likelihood * target_mask).sum()
        log_posterior = None
        if posterior:
            log_posterior = hmm_algorithms.zero_order_log_posterior(
                log_alpha, log_emission, src.ne(PAD_ID), log_link)
        return nll, target_mask.sum(), log_posterior

    def alignment_scores(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                         method: str, **options) -> torch.Tensor:
        """α(j|i) (``hmm-alignment``) or p(j | e_i, e_<i, f) (``hmm-posterior``): (B, I+1, J+1)."""
        shortlist = self._check_method(method, options)
        log_alpha, source_hidden, target_hidden = self.decode(src, tgt_in)
        if method == "hmm-alignment":
            return log_alpha.exp()
        log_emission, log_link = self.emissions(source_hidden, target_hidden, tgt_out,
                                                shortlist=shortlist)
        return hmm_algorithms.zero_order_posterior(log_alpha, log_emission, src.ne(PAD_ID),
                                                   log_link)

    def decode_prior(self, log_alpha: torch.Tensor, state: DecodeState,
                     prev_tokens: torch.Tensor) -> torch.Tensor:
        """π(j) = α(j|i)."""
        return log_alpha


class FirstOrderHMM(DirectHMM):
    """First-order direct HMM (``align train --model hmm1``)."""

    METHODS: Tuple[str, ...] = ("hmm-posterior", "hmm-viterbi", "hmm-alignment")
    #: `align translate --print-alignment`: the back-trace of the best final state
    TRANSLATE_ALIGNMENT_METHOD = "hmm-viterbi"
    order = 1

    def decode_prior(self, log_alpha: torch.Tensor, state: DecodeState,
                     prev_tokens: torch.Tensor) -> torch.Tensor:
        """π(j) = α(j|0, start) at the first position; later Σ_j' q(j') α(j|i, j') with the
        forward state q of the previous position, which the word chosen there (prev_tokens)
        determines: ``state["forward"]`` is updated from the previous step's ``pending``."""
        if "pending" in state:
            state["forward"] = self.forward_state(state.pop("pending"), prev_tokens)
        if "forward" not in state:
            return log_alpha[:, 0]                                       # α(j | 0, start)
        return hmm_algorithms.forward_step(state["forward"], log_alpha[:, 1:])

    def forward_state(self, pending: Tuple[torch.Tensor, ...], words: torch.Tensor
                      ) -> torch.Tensor:
        """log q(j) (N, J+1) = log π(j) + log p(e|j) − log p(e) for the chosen words e
        (N,), normalized over j (p(e) is that sum). `pending`: the previous step's (log π,
        log normalizers of the lexicon, W5·h, W6·s, the empty word's gate logit or None);
        log p_lex(e|j) = logit(e|j) − log norm(j) is recomputed for the chosen words only
        ((N, J+1) entries, not (N, J+1, V)); with the empty word (its W5·h the last of
        W5·h) p(e|j) = (1 − p0)·p_lex(e|j) + p0·p_lex(e|∅), as in :meth:`emissions`."""
        log_prior, log_norm, source_hidden, target_hidden, gate = pending
        _, logit = lexicon_logits(source_hidden, target_hidden[:, None, :], self.lexicon.weight,
                                  self.lexicon.bias, words=words,
                                  activation=self.config.lexicon_activation)
        log_emission = logit - log_norm
        if gate is not None:
            log_emission, _ = empty_word_mixture(log_emission, gate)
        return torch.log_softmax(log_prior + log_emission, dim=-1)

    @staticmethod
    def split(log_alpha: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B, I+1, J+2, J+1) -> log_initial (B, J+1) and log_transition (B, I+1, J+1, J+1)."""
        return log_alpha[:, 0, 0], log_alpha[:, :, 1:]

    def log_z(self, log_alpha: "torch.Tensor | FirstOrderScores", log_lexicon: torch.Tensor,
              src: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
        """Per-sentence log Z (B,) by the forward recursion over each sentence's own length.

        ``log_alpha`` may be a :class:`FirstOrderScores`: a batch whose transitions fit in
        ``config.chunk_floats`` is computed as one tensor; a larger one in chunks of target
        positions, recomputed in backward (the "tree" algorithm always takes the whole tensor).
        """
        chunk = None
        if isinstance(log_alpha, FirstOrderScores):
            chunk = log_alpha.chunk(self.config.chunk_floats)
            if chunk is None or self.config.forward_algorithm != "loop":
                log_alpha, chunk = log_alpha(0, log_alpha.queries.size(1)), None
        lengths, source_mask = tgt_out.ne(PAD_ID).sum(1), src.ne(PAD_ID)
        if chunk is not None:
            return hmm_algorithms.forward_log_z(log_lexicon, log_alpha.log_initial(),
                                                log_alpha.transitions, lengths, source_mask,
                                                chunk)
        log_initial, log_transition = self.split(log_alpha)
        forward = FORWARD_ALGORITHMS[self.config.forward_algorithm]
        return forward(log_lexicon, log_initial, log_transition, lengths, source_mask)

    def training_terms(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                       label_smoothing: float = 0.0, posterior: bool = False
                       ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """−Σ_sentences log Z (forward algorithm; backward by autograd), the token count, and
        (with ``posterior``) log γ (B, I+1, J+1), γ = ∂ log Z / ∂ (link part of the emission,
        :meth:`emissions`) the forward–backward posterior of the links (the distribution
        ``hmm-posterior`` extracts), differentiable by double backward (create_graph)."""
        log_alpha, log_emission, log_link = self.scores(src, tgt_in, tgt_out, label_smoothing,
                                                        lazy=True)
        log_z = self.log_z(log_alpha, log_emission, src, tgt_out)
        log_posterior = None
        if posterior:
            gamma = hmm_algorithms.posteriors(log_z, log_link, create_graph=True)
            tiny = torch.finfo(gamma.dtype).tiny         # log 0 would give NaN gradients
            log_posterior = gamma.clamp_min(tiny).log()
        return -log_z.sum(), tgt_out.ne(PAD_ID).sum(), log_posterior

    def alignment_scores(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                         method: str, **options) -> torch.Tensor:
        """γ (``hmm-posterior``) or one-hot rows of the Viterbi/greedy path: (B, I+1, J+1)."""
        shortlist = self._check_method(method, options)
        if method == "hmm-posterior":
            log_alpha, log_emission, log_link = self.scores(src, tgt_in, tgt_out, lazy=True,
                                                            shortlist=shortlist)
            return self._posterior(log_alpha, log_emission, log_link, src, tgt_out)
        path = self.alignment_path(src, tgt_in, tgt_out, method, **options)
        return F.one_hot(path.clamp_min(0), src.size(1)).float() * path.ge(0).unsqueeze(-1)

    def alignment_path(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                       method: str, **options) -> Optional[torch.Tensor]:
        """Hard path (B, I+1), source position per target position, -1 at padding, for
        ``hmm-viterbi`` and ``hmm-alignment``; None for ``hmm-posterior`` (argmax of γ).

        The extraction hook of aligner/extract/inference.py. The Viterbi path never puts a real
        target word on the source EOS; the greedy α path may (inference drops such links:
        unaligned).
        """
        shortlist = self._check_method(method, options)
        if method == "hmm-posterior":
            return None
        lengths = tgt_out.ne(PAD_ID).sum(1)
        if method == "hmm-alignment":
            log_alpha, _, _ = self.decode(src, tgt_in, lazy=True)
            return self._greedy_path(log_alpha, lengths, self.config.chunk_floats)
        log_alpha, log_emission, log_link = self.scores(src, tgt_in, tgt_out, lazy=True,
                                                        shortlist=shortlist)
        # real target words may not align to the source EOS; the target EOS row may
        last = torch.arange(tgt_out.size(1), device=src.device)[None, :, None] \
            == (lengths - 1)[:, None, None]
        allowed = src.ne(PAD_ID).unsqueeze(1) & (src.ne(EOS_ID).unsqueeze(1) | last)
        log_emission = log_emission.masked_fill(~allowed, float("-inf"))
        path, _ = hmm_algorithms.viterbi(log_emission, log_alpha.log_initial(),
                                         log_alpha.transitions, lengths, src.ne(PAD_ID),
                                         log_alpha.chunk(self.config.chunk_floats))
        if self.config.null_word:   # a word the empty word more likely emitted: unaligned
            state = path.clamp_min(0).unsqueeze(-1)
            log_link_share = (log_link.gather(-1, state)
                              - log_emission.gather(-1, state)).squeeze(-1)
            path = path.masked_fill(log_link_share < math.log(0.5), -1)
        return path

    def _posterior(self, log_alpha: FirstOrderScores, log_emission: torch.Tensor,
                   log_link: torch.Tensor, src: torch.Tensor, tgt_out: torch.Tensor
                   ) -> torch.Tensor:
        """γ(i, j) = p(b_i = j | e, f) by the explicit forward–backward (no autograd), with
        the transitions in chunks of ``config.chunk_floats``; with the empty word, times the
        link's share of the emission (:meth:`emissions`)."""
        gamma = hmm_algorithms.forward_backward(
            log_emission, log_alpha.log_initial(), log_alpha.transitions,
            tgt_out.ne(PAD_ID).sum(1), src.ne(PAD_ID), log_alpha.chunk(self.config.chunk_floats),
            transition_probs=log_alpha.transition_probs)
        if log_link is not log_emission:
            gamma = gamma * (log_link.float() - log_emission.float()).exp().to(gamma.dtype)
        return gamma

    @staticmethod
    def _greedy_path(log_alpha: FirstOrderScores, lengths: torch.Tensor,
                     chunk_floats: int = 0) -> torch.Tensor:
        """b_0 = argmax α(j|0,start), b_i = argmax_j α(j|i,b_{i-1}): (B, I+1), -1 at padding."""
        batch, steps = log_alpha.queries.shape[:2]
        chunk = log_alpha.chunk(chunk_floats) or steps
        rows = torch.arange(batch, device=log_alpha.queries.device)
        path = []
        for start in range(0, steps, chunk):
            block = log_alpha(start, min(start + chunk, steps))        # (B, c, J+2, J+1)
            for offset in range(block.size(1)):
                # row 0 is the start state, row j' + 1 the previous state j'
                previous = 0 if not path else path[-1] + 1
                state = block[rows, offset, previous].argmax(-1)
                path.append(state)
        path_tensor = torch.stack(path, dim=1)
        positions = torch.arange(steps, device=path_tensor.device).unsqueeze(0)
        return path_tensor.masked_fill(positions >= lengths.unsqueeze(1), -1)
