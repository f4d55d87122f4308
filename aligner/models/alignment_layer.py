"""Alignment layer on a frozen transformer, and attention optimization (Zenkel et al., 2019).

Zenkel, Wuebker and DeNero, *Adding Interpretable Attention to Neural Translation Models
Improves Word Alignment* (2019). A trained transformer (the *base*) is frozen; on top of it one
extra single-head attention layer learns to predict the next target word from the source alone:

    q_i   = W_q s_i                       s_i: base decoder output at target position i (B, I+1, d)
    k_j   = W_k E_j,  v_j = W_v E_j       E_j: source representation (B, J+1, d), see KEY_KINDS
    α_ij  = softmax_j (q_i · k_j / √d)    over real source words only (EOS and padding masked;
                                          the guided layer below also attends to EOS)
    c_i   = Σ_j α_ij v_j                  no residual, no self-attention, no feed-forward
    p(e_i | e_<i, f) = softmax(W_o c_i + b_o)        the layer's own output softmax

Keys and values come from one of (``--layer-keys``):

* ``word`` — the base's source word embeddings (``Transformer.embed_source_words``),
* ``enc``  — the base's encoder output (``Transformer.encode``),
* ``add``  — their average (word + enc) / 2 (the default; the paper's best variant).

Because the query only sees the left target context (the base decoder is causal) and the
layer sees the source only through α, the attention must point at the source word that
predicts e_i: α is the alignment (method ``layer``: argmax_j α_ij).

**Guided layer** (``--layer-query target``; Zenkel, Wuebker and DeNero 2020, *End-to-End
Neural Word Alignment Outperforms GIZA++*, train the layer on guide alignments). When the
target is known (alignment, not translation), the query of position i may see the word it
aligns, e_i = tgt_out_i, and the whole target sentence:

    x_i   = s_i + T(e_i)                  T: the base's (frozen, scaled) target word embedding
    h     = Blocks_t(x)                   transformer blocks, non-causal over the target
    E'    = Blocks_s(E)                   likewise over the source (keys and values)
    q_i   = W_q h_i,  k_j = W_k E'_j,  v_j = W_v E'_j   then α, c_i and p(e_i | ...) as above

The blocks (:class:`ContextBlock`, ``layer_blocks`` per side, ``-M layer_blocks=N``) are
trainable, the base stays frozen.

The layer is then trained with the guide's cross-entropy on log α (``align train --guide``,
aligner/training/guidance.py) beside its own NLL: α is the alignment distribution of the
model contract's ``training_terms``. Its attention may also point at the source EOS, which
means "not aligned": a target word the guide leaves without a link is guided there
(``GUIDE_UNALIGNED_TO_EOS``), and extraction links a word only where its best source word
is at least as likely as EOS (``leaves_unaligned_mass``). Its default extraction method is
``layer`` (the guided attention itself); ``layer-sgd`` still works on it. ``prefix`` (the
default without a guide) is the 2019 layer above.

**Attention optimization** (method ``layer-sgd``). For a known target word e_i the attention
row A_i· is treated as a free variable, initialized from the forward pass (``init="forward"``)
or uniformly at random in [0, 1] (``init="random"``). The softmax is replaced by a ReLU, so the
layer output is the *unnormalized* mixture

    c_i(A) = Σ_j relu(A_ij) v_j ,      log p(e_i | A) = log_softmax(W_o c_i(A) + b_o)[e_i],

exactly as in the paper (no renormalization of relu(A)). N gradient *ascent* steps
A ← A + lr · ∂ log p(e_i | A) / ∂A (default N = 3, lr = 1) are taken for all target positions
and sentences in parallel: the objective is the sum of log p(e_i | A) over non-pad positions,
and row i of A only influences the term of position i, so the summed gradient is the
per-position gradient. EOS and padding columns are held at zero in every step. The alignment
is argmax_j of the optimized A; with N = 0 it equals the ``layer`` alignment.

Index conventions follow aligner/models/base.py: src (B, J+1) ends with EOS, tgt_in / tgt_out
(B, I+1), scores (B, I+1, J+1) [batch, target position, source position].

Saving: the model's state_dict holds the base transformer (``base.*``) *and* the layer
(``layer.*``), so a model directory of kind ``alignment-layer`` is self-contained: its params
files carry both, the base bit-identical to the one it was trained on.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from aligner.constants import DEFAULT_SEED, EOS_ID, PAD_ID
from aligner.models.base import AlignmentModel, DecodeState
from aligner.models.transformer import (FeedForward, MultiHeadAttention, Transformer,
                                        TransformerConfig)
from aligner.utils import AlignerError, check_condition

#: where the layer's keys and values come from (see module docstring)
KEY_KINDS = ("word", "enc", "add")
DEFAULT_KEYS = "add"
#: what the layer's queries see: the base decoder state alone (left context, Zenkel et al.
#: 2019), or also the known target word and the whole target (the guided layer, 2020)
QUERY_KINDS = ("prefix", "target")
DEFAULT_QUERY = "prefix"
#: initializations of the attention optimization
INITS = ("forward", "random")
DEFAULT_SGD_STEPS = 3
DEFAULT_SGD_LR = 1.0


def source_mask(src: torch.Tensor, null: bool = False) -> torch.Tensor:
    """Source positions the layer may attend to: real words, not padding, and EOS only with
    `null` (the guided layer's "not aligned").

    src: LongTensor (B, J+1) → BoolTensor (B, 1, J+1), broadcastable over target positions.
    """
    allowed = src != PAD_ID
    return (allowed if null else allowed & (src != EOS_ID)).unsqueeze(1)


def combine_keys(word: torch.Tensor, enc: torch.Tensor, kind: str) -> torch.Tensor:
    """Source representation E (B, J+1, d) for keys and values: `word`, `enc` or their average `add`."""
    if kind == "word":
        return word
    if kind == "enc":
        return enc
    if kind == "add":
        return (word + enc) / 2
    raise ValueError(f"unknown key kind {kind!r}; expected one of {KEY_KINDS}")


class ContextBlock(nn.Module):
    """One trainable, non-causal transformer block of the guided layer: every position sees
    the whole sentence but its padding.

    ``forward(x (B, L, d), pad (B, L) bool True = pad)`` → (B, L, d):
    h = LayerNorm(x + SelfAttention(x)), then LayerNorm(h + FeedForward(h)).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.attention = MultiHeadAttention(d_model, n_heads, dropout)
        self.attention_norm = nn.LayerNorm(d_model)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.feed_forward_norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        context, _ = self.attention(x, x, key_padding_mask=pad)
        h = self.attention_norm(x + self.dropout(context))
        return self.feed_forward_norm(h + self.dropout(self.feed_forward(h)))


class ContextBlocks(nn.Module):
    """`n_blocks` :class:`ContextBlock` in a row:
    ``forward(x (B, L, d), pad (B, L))`` → (B, L, d)."""

    def __init__(self, n_blocks: int, d_model: int, n_heads: int, d_ff: int,
                 dropout: float) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ContextBlock(d_model, n_heads, d_ff, dropout)
                                    for _ in range(n_blocks))

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, pad)
        return x


class AlignmentLayer(nn.Module):
    """One single-head attention layer with its own output softmax (no residual, no FFN),
    and with ``context_heads`` > 0 (the guided layer) ``context_blocks`` :class:`ContextBlock`
    on each side: ``target_context`` for the queries' input, ``source_context`` for the keys'
    and values'.

    Pure tensors in, tensors out: it knows nothing of the base model.
    """

    def __init__(self, d_model: int, vocab_size: int, dropout: float = 0.1,
                 context_heads: int = 0, context_ff: int = 0, context_blocks: int = 1) -> None:
        super().__init__()
        self.d_model = d_model
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.output = nn.Linear(d_model, vocab_size)
        self.dropout = nn.Dropout(dropout)
        guided = context_heads > 0
        self.target_context = (ContextBlocks(context_blocks, d_model, context_heads, context_ff,
                                             dropout) if guided else None)
        self.source_context = (ContextBlocks(context_blocks, d_model, context_heads, context_ff,
                                             dropout) if guided else None)

    def attention_logits(self, states: torch.Tensor, source: torch.Tensor,
                         allowed: torch.Tensor) -> torch.Tensor:
        """Masked attention logits (B, I+1, J+1) float32: the lowest float where not allowed.

        states: (B, I+1, d) query side; source: (B, J+1, d) keys' input E; allowed: BoolTensor
        (B, 1, J+1) from `source_mask`.
        """
        query = self.query(states)
        key = self.key(source)
        # float32 (a no-op in fp32): under bf16 autocast the weights are probabilities that
        # extraction and layer-sgd read, so the softmax must not run in bfloat16
        logits = (torch.matmul(query, key.transpose(1, 2)) / self.d_model ** 0.5).float()
        return logits.masked_fill(~allowed, torch.finfo(logits.dtype).min)

    def attention(self, states: torch.Tensor, source: torch.Tensor,
                  allowed: torch.Tensor) -> torch.Tensor:
        """Attention weights α (B, I+1, J+1); each row sums to 1 over allowed positions, 0 elsewhere.

        states: (B, I+1, d) query side (base decoder output, or the target :class:`ContextBlock`'s);
        source: (B, J+1, d) keys' input E; allowed: BoolTensor (B, 1, J+1) from `source_mask`.
        A row with no allowed position (empty source) is all zeros rather than NaN.
        """
        return torch.softmax(self.attention_logits(states, source, allowed), dim=-1) * allowed

    def values(self, source: torch.Tensor) -> torch.Tensor:
        """Projected values W_v E: (B, J+1, d)."""
        return self.value(source)

    def output_logits(self, weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits (B, I+1, V) of the context Σ_j weights_ij · values_j.

        weights: (B, I+1, J+1) — softmax attention, or relu(A) during attention optimization;
        values: (B, J+1, d) from `values`.
        """
        return self.output(self.dropout(torch.matmul(weights, values)))

    def forward(self, states: torch.Tensor, source: torch.Tensor,
                allowed: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(logits (B, I+1, V), attention α (B, I+1, J+1))."""
        weights = self.attention(states, source, allowed)
        return self.output_logits(weights, self.values(source)), weights


def target_log_probs(layer: AlignmentLayer, weights: torch.Tensor, values: torch.Tensor,
                     tgt_out: torch.Tensor) -> torch.Tensor:
    """log p(tgt_out_i | weights) for every target position: (B, I+1) (0 at padding)."""
    log_probs = torch.log_softmax(layer.output_logits(weights, values).float(), dim=-1)
    picked = log_probs.gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1)
    return picked.masked_fill(tgt_out == PAD_ID, 0.0)


def optimize_attention(layer: AlignmentLayer, init: torch.Tensor, values: torch.Tensor,
                       tgt_out: torch.Tensor, allowed: torch.Tensor,
                       steps: int = DEFAULT_SGD_STEPS, lr: float = DEFAULT_SGD_LR) -> torch.Tensor:
    """Attention optimization: `steps` gradient-ascent steps on log p(e_i | relu(A)).

    init: (B, I+1, J+1) starting attention A (forward-pass α or random); values: (B, J+1, d)
    projected values; tgt_out: (B, I+1) the known target words; allowed: (B, 1, J+1).
    Returns the optimized A (B, I+1, J+1), detached, zero where not `allowed`. The layer's
    parameters are not changed. Works when called under torch.no_grad() or inference_mode().
    """
    check_condition(steps >= 0, f"--sgd-steps must be >= 0, got {steps}")
    with torch.inference_mode(False), torch.enable_grad():
        # clones turn possible inference-mode tensors into ordinary ones autograd may save
        mask = allowed.clone().to(init.dtype)
        values = values.detach().clone()
        attention = (init.detach().clone() * mask).requires_grad_(True)
        was_training = layer.training
        layer.eval()  # no dropout while optimizing
        try:
            for _ in range(steps):
                objective = target_log_probs(layer, torch.relu(attention) * mask, values,
                                             tgt_out.clone()).sum()
                (gradient,) = torch.autograd.grad(objective, attention)
                attention = ((attention + lr * gradient) * mask).detach().requires_grad_(True)
        finally:
            layer.train(was_training)
        return attention.detach()


def random_attention(shape: Tuple[int, ...], allowed: torch.Tensor, seed: int) -> torch.Tensor:
    """Uniform [0, 1) attention (B, I+1, J+1) from a seeded CPU generator, zero where not allowed."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.rand(shape, generator=generator).to(allowed.device)
    return weights * allowed


@dataclass
class AlignmentLayerConfig(TransformerConfig):
    """The base transformer's hyper-parameters plus those of the alignment layer."""

    #: keys = values of the layer: word embeddings, encoder output or their average
    layer_keys: str = DEFAULT_KEYS
    #: dropout on the layer's context vector during stage-2 training
    layer_dropout: float = 0.1
    #: what the queries see: ``prefix`` (2019) or ``target`` (the guided layer), see QUERY_KINDS
    layer_query: str = DEFAULT_QUERY
    #: the guided layer's trainable context blocks on each side (ContextBlock): 2, chosen on
    #: en-fr dev (grow-diag 12.1 / 10.7 / 10.8 with 1 / 2 / 3 after 1,500 updates;
    #: eval/results/alignment_layer.md)
    layer_blocks: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        check_condition(self.layer_keys in KEY_KINDS, f"--layer-keys must be one of "
                                                      f"{', '.join(KEY_KINDS)}, got {self.layer_keys!r}")
        check_condition(self.layer_query in QUERY_KINDS, f"--layer-query must be one of "
                                                         f"{', '.join(QUERY_KINDS)}, got "
                                                         f"{self.layer_query!r}")
        check_condition(self.layer_blocks >= 1,
                        f"layer_blocks must be at least 1, got {self.layer_blocks}")
        check_condition(0.0 <= self.layer_dropout < 1.0,
                        f"layer dropout must be in [0, 1): {self.layer_dropout}")

    def base_config(self) -> TransformerConfig:
        """The config of the base transformer alone."""
        names = {field.name for field in dataclasses.fields(TransformerConfig)}
        return TransformerConfig(**{k: v for k, v in self.to_dict().items() if k in names})


class AlignmentLayerModel(AlignmentModel):
    """A frozen base `Transformer` plus one `AlignmentLayer` (one direction).

    Only the layer has trainable parameters; the base is kept in eval mode (no dropout) even
    when the model is put in training mode, so its outputs during stage-2 training equal those
    at extraction. `loss` trains the layer; `alignment_scores` serves the base's methods
    (``attention``, ``attention-avg``) and ``layer`` / ``layer-sgd``. Translation
    (`init_decode_state`, `decode_step`) is the frozen base's: the layer predicts the next
    word from the source alone, as an alignment model, not as a translation model.

    Two-stage training: build the model, copy a trained transformer's weights in with
    `load_base` (stage 1 output, or ``--base MODEL``), then run the ordinary trainer: it only
    sees the layer's parameters (the base's have requires_grad False).
    """

    LAYER_METHODS: Tuple[str, ...] = ("layer-sgd", "layer")
    #: the first is the default of `align extract`: the paper's best method
    METHODS: Tuple[str, ...] = LAYER_METHODS + Transformer.METHODS
    config_class = AlignmentLayerConfig
    #: trained on a frozen base of this kind (two-stage training, see aligner.training.run)
    BASE_KIND = "transformer"
    #: config keys of the layer itself; all others describe the base
    LAYER_OPTIONS: Tuple[str, ...] = ("layer_keys", "layer_dropout", "layer_query",
                                      "layer_blocks")
    #: the layer's attention is the alignment distribution guided training needs
    #: (``training_terms``: log α)
    TRAINS_POSTERIOR = True

    @classmethod
    def split_options(cls, options: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """Model options -> (options of the base transformer, options of the layer).

        The layer's options come with their defaults filled in, so that config.json always
        says which keys the layer was trained with.
        """
        defaults = {name: field.default for name, field in
                    AlignmentLayerConfig.__dataclass_fields__.items() if name in cls.LAYER_OPTIONS}
        base = {k: v for k, v in options.items() if k not in cls.LAYER_OPTIONS}
        layer = {**defaults, **{k: v for k, v in options.items() if k in cls.LAYER_OPTIONS}}
        return base, layer

    def __init__(self, config: AlignmentLayerConfig) -> None:
        super().__init__()
        self.config = config
        self.layer_keys = config.layer_keys
        self.base = Transformer(config.base_config())
        self.freeze_base()
        target_query = config.layer_query == "target"
        self.layer = AlignmentLayer(config.d_model, config.tgt_vocab_size, config.layer_dropout,
                                    context_heads=config.n_heads if target_query else 0,
                                    context_ff=config.d_ff, context_blocks=config.layer_blocks)
        if target_query:   # the guided attention is the alignment itself: `layer` first
            self.METHODS = ("layer", "layer-sgd") + Transformer.METHODS
            self.GUIDE_UNALIGNED_TO_EOS = True

    def freeze_base(self) -> None:
        """requires_grad False for every base parameter, and eval mode for the base."""
        for parameter in self.base.parameters():
            parameter.requires_grad_(False)
        self.base.eval()

    def load_base(self, state_dict: Dict[str, torch.Tensor]) -> None:
        """Copy a trained transformer's weights (its state_dict) into the frozen base."""
        self.base.load_state_dict(state_dict)
        self.freeze_base()

    def train(self, mode: bool = True) -> "AlignmentLayerModel":
        """Training mode for the layer only; the frozen base always stays in eval mode."""
        super().train(mode)
        self.base.eval()
        return self

    def _features(self, src: torch.Tensor, tgt_in: torch.Tensor,
                  tgt_out: Optional[torch.Tensor] = None
                  ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer's inputs: queries' input (B, I+1, d), source E (B, J+1, d), mask (B, 1, J+1).

        The base's features are computed without gradients; with ``layer_query`` ``target``
        (the guided layer) the queries' input is the layer's own target :class:`ContextBlock`
        of the base decoder states plus the target words tgt_out (B, I+1) (read by it only),
        and the source E passes through its source :class:`ContextBlock`: both trainable.
        """
        target_query = self.layer.target_context is not None
        assert tgt_out is not None or not target_query, "the guided layer's queries need tgt_out"
        with torch.no_grad():
            memory = self.base.encode(src)
            states, _ = self.base.decode(tgt_in, memory, src)
            source = combine_keys(self.base.embed_source_words(src), memory, self.layer_keys)
            words = self.base.embed_target_words(tgt_out) if target_query else None
        if target_query:
            states = self.layer.target_context(states + words, tgt_out == PAD_ID)
            source = self.layer.source_context(source, src == PAD_ID)
        return states, source, source_mask(src, null=target_query)

    def leaves_unaligned_mass(self, method: str) -> bool:
        """The guided layer's ``layer`` rows leave the EOS column's mass as "not aligned"."""
        return self.layer.target_context is not None and method == "layer"

    def layer_forward(self, src: torch.Tensor, tgt_in: torch.Tensor,
                      tgt_out: Optional[torch.Tensor] = None
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(logits (B, I+1, V), attention α (B, I+1, J+1)) of the alignment layer."""
        states, source, allowed = self._features(src, tgt_in, tgt_out)
        return self.layer(states, source, allowed)

    def loss(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
             label_smoothing: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
        """Cross-entropy of the layer's own softmax, summed over non-pad target tokens.

        Gradients reach only the layer. Returns (loss_sum, n_tokens) like every model.
        """
        nll, tokens, _ = self.training_terms(src, tgt_in, tgt_out, label_smoothing)
        return nll, tokens

    def training_terms(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                       label_smoothing: float = 0.0, posterior: bool = False
                       ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(NLL as :meth:`loss`, tokens, log α (B, I+1, J+1) when ``posterior``): the model
        contract's terms (aligner/models/base.py). log α is the layer's log attention of
        decoder position i over the source positions; columns the layer may not attend to
        (padding, and EOS for the 2019 layer; the guided layer's EOS is "not aligned") hold the
        lowest float's log-softmax (probability 0, finite); a row of an empty source is uniform.
        """
        states, source, allowed = self._features(src, tgt_in, tgt_out)
        logits = self.layer.attention_logits(states, source, allowed)
        weights = torch.softmax(logits, dim=-1) * allowed
        output = self.layer.output_logits(weights, self.layer.values(source))
        nll = F.cross_entropy(output.float().reshape(-1, output.size(-1)), tgt_out.reshape(-1),
                              ignore_index=PAD_ID, reduction="sum",
                              label_smoothing=label_smoothing)
        log_attention = torch.log_softmax(logits, dim=-1) if posterior else None
        return nll, (tgt_out != PAD_ID).sum(), log_attention

    def init_decode_state(self, src: torch.Tensor, **options) -> DecodeState:
        """The frozen base transformer's (translation is the base's)."""
        return self.base.init_decode_state(src, **options)

    def decode_step(self, state: DecodeState, prev_tokens: torch.Tensor
                    ) -> Tuple[torch.Tensor, DecodeState]:
        """The frozen base transformer's (translation is the base's)."""
        return self.base.decode_step(state, prev_tokens)

    def reorder_decode_state(self, state: DecodeState, rows: torch.Tensor) -> DecodeState:
        """The frozen base transformer's."""
        return self.base.reorder_decode_state(state, rows)

    def alignment_scores(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                         method: str, **options: Any) -> torch.Tensor:
        """Scores (B, I+1, J+1) for `method`.

        ``layer``: the layer's attention α (no options). ``layer-sgd``: α, or uniform random
        weights with ``init="random"``, optimized by ``sgd_steps`` (default 3) ascent steps of
        rate ``sgd_lr`` (default 1.0), see `optimize_attention`; ``seed`` fixes the random init
        (default constants.DEFAULT_SEED). Other methods go to the base transformer with
        `options` (e.g. ``layer=`` for ``attention``). Unknown options are user errors.
        """
        if method not in self.LAYER_METHODS:
            return self.base.alignment_scores(src, tgt_in, tgt_out, method, **options)
        settings = layer_sgd_settings(method, options)
        with torch.no_grad():
            states, source, allowed = self._features(src, tgt_in, tgt_out)
            weights = self.layer.attention(states, source, allowed)
            values = self.layer.values(source)
        if method == "layer":
            return weights
        if settings["init"] == "random":
            weights = random_attention(tuple(weights.shape), allowed,
                                       settings["seed"]).to(weights.dtype)
        return optimize_attention(self.layer, weights, values, tgt_out, allowed,
                                  settings["sgd_steps"], settings["sgd_lr"])


def layer_sgd_settings(method: str, options: Dict[str, Any]) -> Dict[str, Any]:
    """Validated options of ``layer`` (none) and ``layer-sgd`` (sgd_steps, sgd_lr, init, seed).

    Values may arrive as text or JSON-typed (``align extract -O sgd_steps=5``); None = default.
    """
    defaults = {"sgd_steps": DEFAULT_SGD_STEPS, "sgd_lr": DEFAULT_SGD_LR, "init": "forward",
                "seed": DEFAULT_SEED}
    given = {key: value for key, value in options.items() if value is not None}
    allowed_keys = set(defaults) if method == "layer-sgd" else set()
    unknown = sorted(set(given) - allowed_keys)
    check_condition(not unknown, f"method '{method}' takes no option(s) {', '.join(unknown)}"
                                 + (f" (it takes {', '.join(sorted(allowed_keys))})"
                                    if allowed_keys else ""))
    settings = {**defaults, **given}
    try:
        steps = int(settings["sgd_steps"])
        lr = float(settings["sgd_lr"])
        seed = int(settings["seed"])
    except (TypeError, ValueError):
        raise AlignerError(f"layer-sgd options must be numbers: sgd_steps={settings['sgd_steps']!r}, "
                           f"sgd_lr={settings['sgd_lr']!r}, seed={settings['seed']!r}") from None
    check_condition(steps >= 0 and steps == float(settings["sgd_steps"]),
                    f"--sgd-steps must be a whole number >= 0, got {settings['sgd_steps']!r}")
    check_condition(settings["init"] in INITS,
                    f"--init must be one of {', '.join(INITS)}, got {settings['init']!r}")
    return {"sgd_steps": steps, "sgd_lr": lr, "init": settings["init"], "seed": seed}
