"""The transformer encoder–decoder and its building blocks (pre-norm, nanoGPT-plain).

Shapes follow aligner/models/base.py: ``src`` (B, J+1) = source ids + EOS, ``tgt_in`` (B, I+1) =
BOS + target ids, ``tgt_out`` (B, I+1) = target ids + EOS, all right-padded with PAD (id 0).
Padding masks are derived from the ids; every mask below is a bool tensor where **True means
"masked out"** (a padding key, or a future position under the causal mask).

Attention weights are returned as (B, H, I_q, J_k): [batch, head, query position, key position].

The building blocks are shared by the other model kinds (direct HMM, alignment layer):

* :class:`Embedding` — token embedding · sqrt(d) + sinusoidal positions + dropout;
  :meth:`Embedding.word` gives the pure (scaled) word embedding without positions.
* :class:`MultiHeadAttention` — self- or cross-attention, optional causal mask, optional weights.
* :class:`FeedForward`, :class:`EncoderLayer`, :class:`Encoder`, :class:`DecoderLayer`,
  :class:`Decoder`.
* :func:`self_attention_mask`, :func:`decoder_self_attention` — the decoder's causal
  self-attention, optionally *Markov* (``markov_order`` k > 0, Du et al., *Revisiting the
  Markov Property for Machine Translation*): each position sees only the k target positions
  ending at itself, and keys/values are their *static* embeddings (the decoder embedding
  layer's output), not the layer's hidden states, so nothing older leaks in through deeper
  layers (transparent attention). The same helper serves incremental decoding: queries are the
  last positions of a longer key history.
* Incremental decoding (the decode contract of aligner/models/base.py, shared with the direct
  HMM): :func:`init_decoder_history`, :func:`static_history` and :func:`layer_history` give
  every decoder layer the keys/values input of its self-attention, for a whole sequence or one
  new position at a time. Per hypothesis the state holds, for an ordinary decoder, each
  layer's *inputs* at all earlier positions (N, t, d): the layer's keys/values are recomputed
  from them (a cache of layer inputs, not of projected keys/values), so the cost per step
  grows with t; for a Markov decoder (order k) only the *static embeddings* of the last k
  tokens, shared by all layers: no key/value cache, constant cost per step.
* :class:`Transformer` — the baseline :class:`AlignmentModel` with the extraction methods
  ``attention`` (one decoder layer, heads averaged) and ``attention-avg`` (all layers and heads);
  its decoding step is log_softmax(W_out · s_i) of the newest position.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from aligner.config import ModelConfig
from aligner.constants import PAD_ID, SPECIAL_TOKENS
from aligner.models.base import AlignmentModel, DecodeState
from aligner.utils import AlignerError, check_condition


@dataclass
class TransformerConfig(ModelConfig):
    """Every hyper-parameter of the transformer (saved in the model directory's config)."""

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 256
    n_heads: int = 4
    enc_layers: int = 3
    dec_layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1
    #: longest sequence (subwords + BOS/EOS) the sinusoidal table covers
    max_positions: int = 1024
    #: share the decoder input embedding with the output projection
    tie_embeddings: bool = True
    #: Markov decoder: self-attention sees only the previous k target tokens, keys and values
    #: = their static embeddings (see :func:`decoder_self_attention`); 0 = ordinary causal
    markov_order: int = 0

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size"):
            check_condition(getattr(self, name) >= len(SPECIAL_TOKENS),
                            f"{name} must be at least {len(SPECIAL_TOKENS)} (the special "
                            f"tokens): {getattr(self, name)}")
        for name in ("d_model", "n_heads", "d_ff"):
            check_condition(getattr(self, name) >= 1,
                            f"{name} must be positive: {getattr(self, name)}")
        check_condition(self.max_positions >= 2,
                        f"max_positions must be at least 2 (a subword plus BOS/EOS): "
                        f"{self.max_positions}")
        check_condition(self.d_model % self.n_heads == 0,
                        f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        check_condition(self.enc_layers >= 1 and self.dec_layers >= 1,
                        "the transformer needs at least one encoder and one decoder layer")
        check_condition(0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1): {self.dropout}")
        check_condition(self.markov_order >= 0,
                        f"markov_order must be >= 0 (0 = no Markov restriction): "
                        f"{self.markov_order}")



def sinusoidal_positions(n_positions: int, d_model: int) -> torch.Tensor:
    """Vaswani et al. position table (n_positions, d_model): sin on even, cos on odd channels."""
    position = torch.arange(n_positions, dtype=torch.float32).unsqueeze(1)
    rate = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32)
                     * (-math.log(10000.0) / d_model))
    table = torch.zeros(n_positions, d_model)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate[: d_model // 2])
    return table


class Embedding(nn.Module):
    """Token embedding · sqrt(d) + sinusoidal position + dropout.

    ``forward(ids (B, L)) -> (B, L, d)``. :meth:`word` is the scaled token embedding alone
    (no position, no dropout): the "word embeddings" the alignment layer attends to.
    """

    def __init__(self, vocab_size: int, d_model: int, max_positions: int, dropout: float):
        super().__init__()
        self.d_model = d_model
        self.max_positions = max_positions
        self.token = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        nn.init.normal_(self.token.weight, mean=0.0, std=d_model ** -0.5)
        with torch.no_grad():
            self.token.weight[PAD_ID].zero_()
        self.register_buffer("positions", sinusoidal_positions(max_positions, d_model),
                             persistent=False)
        self.dropout = nn.Dropout(dropout)

    def word(self, ids: torch.Tensor) -> torch.Tensor:
        """Scaled word embeddings (B, L, d) of ids (B, L), without positions."""
        return self.token(ids) * math.sqrt(self.d_model)

    def forward(self, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """ids (B, L) at positions offset..offset+L-1 -> (B, L, d) (offset: incremental
        decoding)."""
        length = ids.size(1)
        if offset + length > self.max_positions:
            raise AlignerError(f"sequence of {offset + length} tokens exceeds max_positions "
                               f"({self.max_positions})")
        return self.dropout(self.word(ids) + self.positions[offset:offset + length])


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (self or cross).

    ``forward(query (B, Iq, d), memory (B, Jk, d), key_padding_mask (B, Jk) bool True = pad,
    causal, need_weights, attn_mask (Iq, Jk) bool True = masked)`` returns
    ``(output (B, Iq, d), weights (B, H, Iq, Jk) or None)``.
    Without weights it runs ``F.scaled_dot_product_attention`` (the fast path used in training),
    except for bfloat16 training on a CPU (:func:`_explicit_attention`); with weights it
    computes an explicit softmax. The returned weights are the probabilities
    *before* attention dropout (identical to the fast path in eval mode).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        assert d_model % n_heads == 0
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, d) -> (B, H, L, d/H)."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)

    @staticmethod
    def build_mask(key_padding_mask: Optional[torch.Tensor], n_queries: int, n_keys: int,
                   causal: bool, device: torch.device) -> Optional[torch.Tensor]:
        """Bool mask (B or 1, 1, Iq, Jk), True = masked out; None when nothing is masked."""
        mask = None
        if key_padding_mask is not None:
            mask = key_padding_mask[:, None, None, :]
        if causal:
            future = torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).triu(1)
            future = future[None, None]
            mask = future if mask is None else (mask | future)
        return mask

    def forward(self, query: torch.Tensor, memory: torch.Tensor,
                key_padding_mask: Optional[torch.Tensor] = None, causal: bool = False,
                need_weights: bool = False, attn_mask: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        batch, n_queries, d_model = query.shape
        q = self._heads(self.q_proj(query))
        k = self._heads(self.k_proj(memory))
        v = self._heads(self.v_proj(memory))
        mask = self.build_mask(key_padding_mask, n_queries, memory.size(1), causal, query.device)
        if attn_mask is not None:  # an extra (Iq, Jk) mask, e.g. self_attention_mask
            mask = attn_mask[None, None] if mask is None else (mask | attn_mask[None, None])
        dropout = self.dropout if self.training else 0.0
        weights = None
        if need_weights or _explicit_attention(q):
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
            if mask is not None:
                scores = scores.masked_fill(mask, float("-inf"))
            weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            context = F.dropout(weights, p=dropout, training=self.training) @ v
        else:
            allowed = None if mask is None else ~mask
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout)
        context = context.transpose(1, 2).reshape(batch, n_queries, d_model)
        return self.out_proj(context), (weights if need_weights else None)


def _explicit_attention(q: torch.Tensor) -> bool:
    """Whether attention with gradients on bfloat16 CPU tensors `q` runs as explicit products:
    torch's CPU flash attention in bfloat16 takes 4-8x the time of the explicit
    products, backward included (eval/results/train_bf16_cpu.md)."""
    return q.dtype == torch.bfloat16 and q.device.type == "cpu" and torch.is_grad_enabled()


def self_attention_mask(n_queries: int, n_keys: int, markov_order: int,
                        device: torch.device) -> torch.Tensor:
    """Bool mask (Iq, Jk) of decoder self-attention, True = masked out.

    The queries are the *last* Iq of the Jk key positions (query r sits at key position
    r + Jk - Iq; Iq = Jk in training). Each query sees itself and earlier keys; with
    ``markov_order`` k > 0 only the k keys ending at itself (positions p-k+1..p).
    """
    query_position = torch.arange(n_queries, device=device)[:, None] + (n_keys - n_queries)
    key_position = torch.arange(n_keys, device=device)[None, :]
    masked = key_position > query_position
    if markov_order > 0:
        masked = masked | (key_position <= query_position - markov_order)
    return masked


def decoder_self_attention(attention: MultiHeadAttention, norm: nn.LayerNorm, x: torch.Tensor,
                           tgt_pad_mask: Optional[torch.Tensor],
                           history: Optional[torch.Tensor] = None,
                           markov_order: int = 0) -> torch.Tensor:
    """Self-attention output (B, Iq, d) of a pre-norm decoder layer (residual not added).

    x (B, Iq, d): the layer input at the query positions. Three uses:

    * ``history`` None, ``markov_order`` 0 — ordinary causal attention over x itself
      (keys = values = norm(x), padded keys masked by ``tgt_pad_mask`` (B, Iq)).
    * ``markov_order`` k > 0 — transparent Markov attention: ``history`` (B, Jk, d) holds the
      *static* embeddings (decoder embedding output) of the key positions; keys = values =
      norm(history); each query sees the k positions ending at itself. Required.
    * ``history`` given, ``markov_order`` 0 — incremental decoding: ``history`` holds this
      layer's inputs at every position so far (the query positions last); causal.

    With a history no padding mask is needed: padding is on the right only, so a real query
    never sees a padded key, and every query sees at least itself (no empty softmax row).
    """
    normed = norm(x)
    if history is None:
        if markov_order > 0:
            raise ValueError("Markov self-attention needs the static embeddings (history)")
        return attention(normed, normed, key_padding_mask=tgt_pad_mask, causal=True)[0]
    mask = self_attention_mask(x.size(1), history.size(1), markov_order, x.device)
    return attention(normed, norm(history), attn_mask=mask)[0]


def init_decoder_history(state: DecodeState, memory: torch.Tensor, n_layers: int,
                         markov_order: int) -> DecodeState:
    """Start the self-attention history of a decoding state (no target position yet):
    ``static`` (N, 0, d) for a Markov decoder, else ``history``: one (N, 0, d) per layer.
    ``position`` (the next target position, 0 = BOS) is set to 0. Returns `state`."""
    empty = memory.new_zeros((memory.size(0), 0, memory.size(-1)))
    if markov_order > 0:
        state["static"] = empty
    else:
        state["history"] = [empty] * n_layers
    state["position"] = 0
    return state


def static_history(x: torch.Tensor, markov_order: int,
                   state: Optional[DecodeState] = None) -> Optional[torch.Tensor]:
    """The static embeddings a Markov decoder's self-attention reads (None when not Markov).

    x: the decoder embedding output at the query positions. Whole sequence (``state`` None):
    x itself. Incremental decoding: the state's window of the last ``markov_order`` positions
    with x appended, stored back into ``state["static"]``.
    """
    if markov_order == 0:
        return None
    if state is None:
        return x
    state["static"] = torch.cat([state["static"], x], 1)[:, -markov_order:]
    return state["static"]


def layer_history(state: Optional[DecodeState], index: int, x: torch.Tensor,
                  static: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The ``history`` argument of decoder layer `index` (see :func:`decoder_self_attention`).

    Markov: the static embeddings of :func:`static_history`. Otherwise None for a whole
    sequence (``state`` None: the layer attends over x itself), or, decoding incrementally,
    the layer's inputs at every position so far with its input x at the newest one appended
    (stored back into ``state["history"][index]``).
    """
    if static is not None or state is None:
        return static
    history = torch.cat([state["history"][index], x], 1)
    state["history"][index] = history
    return history


def next_decode_state(state: DecodeState) -> DecodeState:
    """A copy of `state` that a decoding step may update, the given one left as it is: the
    dict and its layer-history list are copied, no tensor is."""
    state = dict(state)
    if "history" in state:
        state["history"] = list(state["history"])
    return state


class FeedForward(nn.Module):
    """Position-wise Linear(d, d_ff) → ReLU → dropout → Linear(d_ff, d).

    (B, L, d) -> (B, L, d).
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(F.relu(self.fc1(x))))


class EncoderLayer(nn.Module):
    """Pre-norm block: x + SelfAttn(LN(x)), then x + FF(LN(x)). (B, J, d) -> (B, J, d)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.norm_attn = nn.LayerNorm(config.d_model)
        self.self_attn = MultiHeadAttention(config.d_model, config.n_heads, config.dropout)
        self.norm_ff = nn.LayerNorm(config.d_model)
        self.ff = FeedForward(config.d_model, config.d_ff, config.dropout)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, src_pad_mask: torch.Tensor) -> torch.Tensor:
        normed = self.norm_attn(x)
        attended, _ = self.self_attn(normed, normed, key_padding_mask=src_pad_mask)
        x = x + self.dropout(attended)
        return x + self.dropout(self.ff(self.norm_ff(x)))


class Encoder(nn.Module):
    """Source embedding + encoder layers + final LayerNorm: src (B, J+1) -> memory (B, J+1, d)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.embed = Embedding(config.src_vocab_size, config.d_model, config.max_positions,
                               config.dropout)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.enc_layers))
        self.norm = nn.LayerNorm(config.d_model)

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        pad_mask = src.eq(PAD_ID)
        x = self.embed(src)
        for layer in self.layers:
            x = layer(x, pad_mask)
        return self.norm(x)


class DecoderLayer(nn.Module):
    """Pre-norm block: causal self-attention, cross-attention to the memory, feed-forward.

    ``forward(x (B, I+1, d), memory (B, J+1, d), tgt_pad_mask (B, I+1), src_pad_mask (B, J+1),
    need_attention, history)`` -> ``(x (B, I+1, d), cross-attention (B, H, I+1, J+1) or None)``;
    ``history``: see :func:`decoder_self_attention` (static embeddings when Markov).
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.markov_order = config.markov_order
        self.norm_self = nn.LayerNorm(config.d_model)
        self.self_attn = MultiHeadAttention(config.d_model, config.n_heads, config.dropout)
        self.norm_cross = nn.LayerNorm(config.d_model)
        self.cross_attn = MultiHeadAttention(config.d_model, config.n_heads, config.dropout)
        self.norm_ff = nn.LayerNorm(config.d_model)
        self.ff = FeedForward(config.d_model, config.d_ff, config.dropout)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, tgt_pad_mask: torch.Tensor,
                src_pad_mask: torch.Tensor, need_attention: bool = False,
                history: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        attended = decoder_self_attention(self.self_attn, self.norm_self, x, tgt_pad_mask,
                                          history, self.markov_order)
        x = x + self.dropout(attended)
        attended, weights = self.cross_attn(self.norm_cross(x), memory,
                                            key_padding_mask=src_pad_mask,
                                            need_weights=need_attention)
        x = x + self.dropout(attended)
        return x + self.dropout(self.ff(self.norm_ff(x))), weights


class Decoder(nn.Module):
    """Target embedding + decoder layers + final LayerNorm.

    ``forward(tgt_in (B, I+1), memory (B, J+1, d), src (B, J+1), need_attention, state)`` ->
    ``(states (B, I+1, d), [cross-attention (B, H, I+1, J+1) per layer] or None)``.
    With a decoding ``state`` (:func:`init_decoder_history`) tgt_in holds the newest
    positions only, starting at ``state["position"]``, and their layer inputs are appended to
    the state's history (in place; the caller advances the position).
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.markov_order = config.markov_order
        self.embed = Embedding(config.tgt_vocab_size, config.d_model, config.max_positions,
                               config.dropout)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.dec_layers))
        self.norm = nn.LayerNorm(config.d_model)

    def forward(self, tgt_in: torch.Tensor, memory: torch.Tensor, src: torch.Tensor,
                need_attention: bool = False, state: Optional[DecodeState] = None
                ) -> Tuple[torch.Tensor, Optional[List[torch.Tensor]]]:
        tgt_pad_mask, src_pad_mask = tgt_in.eq(PAD_ID), src.eq(PAD_ID)
        x = self.embed(tgt_in, offset=0 if state is None else state["position"])
        static = static_history(x, self.markov_order, state)  # Markov: static keys/values
        attention: List[torch.Tensor] = []
        for index, layer in enumerate(self.layers):
            history = layer_history(state, index, x, static)
            x, weights = layer(x, memory, tgt_pad_mask, src_pad_mask, need_attention, history)
            if need_attention:
                attention.append(weights)
        return self.norm(x), (attention if need_attention else None)


class Transformer(AlignmentModel):
    """Encoder–decoder translation model; alignments from its cross-attention.

    Methods (``alignment_scores(..., method, layer=None)``):

    * ``attention`` — cross-attention of decoder layer ``layer`` (1-based; default the
      penultimate layer, Garg et al. 2019; layer 1 when there is only one), heads averaged.
    * ``attention-avg`` — cross-attention averaged over all decoder layers and heads.
    """

    METHODS: Tuple[str, ...] = ("attention", "attention-avg")
    config_class = TransformerConfig

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.output = nn.Linear(config.d_model, config.tgt_vocab_size, bias=False)
        if config.tie_embeddings:
            self.output.weight = self.decoder.embed.token.weight
        else:
            nn.init.normal_(self.output.weight, mean=0.0, std=config.d_model ** -0.5)

    # -- the pieces other model kinds reuse ------------------------------------------------
    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """src (B, J+1) -> memory (B, J+1, d)."""
        return self.encoder(src)

    def embed_source_words(self, src: torch.Tensor) -> torch.Tensor:
        """Scaled source word embeddings (B, J+1, d), no positions (alignment layer keys)."""
        return self.encoder.embed.word(src)

    def embed_target_words(self, tgt: torch.Tensor) -> torch.Tensor:
        """Scaled target word embeddings (B, I+1, d), no positions (the guided alignment
        layer's queries)."""
        return self.decoder.embed.word(tgt)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src: torch.Tensor,
               need_attention: bool = False, state: Optional[DecodeState] = None
               ) -> Tuple[torch.Tensor, Optional[List[torch.Tensor]]]:
        """Decoder states (B, I+1, d) and, when asked, per-layer cross-attention
        (B, H, I+1, J+1); ``state``: incremental decoding (see :class:`Decoder`)."""
        return self.decoder(tgt_in, memory, src, need_attention, state)

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """Output scores (B, I+1, V_tgt) of decoder states (B, I+1, d)."""
        return self.output(states)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Logits (B, I+1, V_tgt) of the next target token at every decoder position."""
        return self.logits(self.decode(tgt_in, self.encode(src), src)[0])

    # -- AlignmentModel interface ----------------------------------------------------------
    def loss(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
             label_smoothing: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
        """Cross-entropy (with label smoothing) summed over non-pad tokens, and their count."""
        logits = self(src, tgt_in)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), tgt_out.reshape(-1),
                               ignore_index=PAD_ID, reduction="sum",
                               label_smoothing=label_smoothing)
        return loss, tgt_out.ne(PAD_ID).sum()

    def default_layer(self) -> int:
        """1-based decoder layer used by ``attention`` when none is given: the penultimate."""
        return max(1, self.config.dec_layers - 1)

    def attention_scores(self, attention: List[torch.Tensor], method: str,
                         layer: Optional[int] = None) -> torch.Tensor:
        """Reduce per-layer cross-attention [(B, H, I+1, J+1)] to (B, I+1, J+1) for `method`."""
        if method == "attention":
            layer = self.default_layer() if layer is None else int(layer)
            check_condition(1 <= layer <= len(attention),
                            f"--layer must be between 1 and {len(attention)} (got {layer})")
            return attention[layer - 1].float().mean(dim=1)
        if method == "attention-avg":
            return torch.stack([weights.float().mean(dim=1) for weights in attention]).mean(0)
        raise AlignerError(f"unknown method '{method}' for the transformer "
                           f"(choose from {', '.join(self.METHODS)})")

    def alignment_scores(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                         method: str, layer: Optional[int] = None, **options) -> torch.Tensor:
        """Cross-attention alignment (B, I+1, J+1): row i = target token tgt_out[:, i]."""
        check_condition(not options, f"method '{method}' takes no options "
                                     f"{', '.join(sorted(options))}")
        check_condition(method in self.METHODS, f"unknown method '{method}' for the transformer "
                                                f"(choose from {', '.join(self.METHODS)})")
        _, attention = self.decode(tgt_in, self.encode(src), src, need_attention=True)
        return self.attention_scores(attention, method, layer)

    def init_decode_state(self, src: torch.Tensor, **options) -> DecodeState:
        """Encoded sources (``memory`` (N, J+1, d)), the sources and the empty layer history."""
        check_condition(not options, f"the transformer takes no decoding options "
                                     f"{', '.join(sorted(options))}")
        state = {"memory": self.encode(src), "src": src}
        return init_decoder_history(state, state["memory"], self.config.dec_layers,
                                    self.config.markov_order)

    def decode_step(self, state: DecodeState, prev_tokens: torch.Tensor
                    ) -> Tuple[torch.Tensor, DecodeState]:
        """log_softmax(W_out · s) (N, V) float32 of the newest position (cast before the
        log_softmax, also under autocast)."""
        state = next_decode_state(state)
        states, _ = self.decode(prev_tokens[:, None], state["memory"], state["src"],
                                state=state)
        state["position"] += 1
        return torch.log_softmax(self.logits(states)[:, -1].float(), dim=-1), state
