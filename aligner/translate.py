"""Translation by beam search with a trained model of any kind, and word alignments of the output.

Returns objects and never writes files (the CLI, aligner/cli/translate.py, prints them).

**Incremental decoding.** A :class:`Stepper` adapts one model kind to the search: ``start``
encodes the sources, ``log_probs`` reads the newest target token of every hypothesis and
returns log p(next token | prefix, source) (N, V) for the last position only, and ``choose``
keeps the rows (hypotheses) the search picked, with the words they were extended by. Per row
the state holds

* ordinary decoders: each decoder layer's *inputs* at all earlier positions (N, t, d): the
  layer's keys/values are recomputed from them (a cache of layer inputs, not of projected
  keys/values), so the cost per step grows with t;
* Markov decoders (``markov_order`` k): only the *static embeddings* of the last k tokens,
  shared by all layers (transparent attention): no key/value cache, constant cost per step;
* hmm1: also the normalized forward state log q(j') = log p(b_{i-1} = j' | e_<i, f) (N, J+1).

Per kind (l_j = log p_lex(e | j), the lexicon of source position j, EOS state included):

* transformer (and the alignment layer's frozen base): log_softmax(W_out · s_i);
* hmm0: log p(e | e_<i, f) = log Σ_j α(j|i) · p_lex(e|j) — the beam runs over the mixture;
* hmm1: prior π_i(j) = Σ_j' q_{i-1}(j') · α(j|i, j') (α(j|0, start) at i = 0),
  log p(e) = log Σ_j π_i(j) · p_lex(e|j); after choosing e the forward state becomes
  q_i(j) = π_i(j) · p_lex(e|j) / p(e). The sum of log p(e) over a hypothesis is log Z of the
  forward algorithm, i.e. exactly the training objective of the output.

The direct HMMs' lexicon of one step, log p_lex(v|j) for N rows × (J+1) positions × V words,
is never held whole: :func:`mixture_log_probs` runs over chunks of source positions with a
running logsumexp (:data:`LEXICON_CHUNK_FLOATS`), and hmm1 recomputes only the chosen words'
entries when it updates q.

**Beam search** (fairseq-style, batched over sentences): each step takes the 2K best
extensions of the K hypotheses of every sentence; an extension by EOS among the first K
ends a hypothesis (score = Σ log p / length^len_penalty, length counting EOS); the K best
non-EOS extensions continue. A sentence is done when it has K ended hypotheses; at its
maximum length (``max_len_a`` · source subwords + ``max_len_b``, capped by the model's
``max_positions``) only EOS is allowed. PAD and BOS are never generated. With K = 1 this is
greedy search. Finished sentences leave the batch.

**Precision.** Run under :func:`aligner.precision.autocast_context` (``align translate
--precision bf16``) the models' matmuls are bfloat16, while every stepper returns float32
log-probabilities (each casts before its log_softmax / logsumexp), so the beam's running
scores and the finished hypotheses' log-probabilities are float32 sums.

**Alignments** (``alignment_method``): after the search, the chosen output is force-decoded
through :func:`aligner.inference.hard_alignment` — the model is causal, so its alignment of
output word i equals what it computed while generating i. Defaults
(:data:`DEFAULT_ALIGNMENT_METHODS`): transformer ``attention`` (penultimate decoder layer,
heads averaged, like ``align extract --method attention``); hmm0 ``hmm-posterior`` (argmax_j
α(j|i)·p_lex(e_i|j) at the chosen word); hmm1 ``hmm-viterbi`` (the back-trace of the best
final state, over the whole output); alignment-layer ``layer-sgd``. Links are between input
words and output words (BPE undone; words are linked if any of their subwords are), as
(input word, output word), 0-based; links to EOS are never output.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from aligner import constants as C
from aligner.data import inference_batches, make_batch, restore_order, subword_to_word_links
from aligner.inference import hard_alignment, model_max_positions
from aligner.model_dir import LoadedModelDir
from aligner.models import MODELS
from aligner.models.alignment_layer import AlignmentLayerModel
from aligner.models.base import AlignmentModel
from aligner.models.direct_hmm import DirectHMM
from aligner.prep import split_words
from aligner.utils import check_condition

logger = logging.getLogger(__name__)

Link = Tuple[int, int]
State = Dict[str, Any]

DEFAULT_BEAM = 5
DEFAULT_MAX_LEN_A = 1.5
DEFAULT_MAX_LEN_B = 10
DEFAULT_LEN_PENALTY = 1.0
#: beam rows × padded source positions per batch
DEFAULT_MAX_TOKENS = 8000
#: `--print-alignment`'s method per model kind: the kind's ``TRANSLATE_ALIGNMENT_METHOD``, else
#: its first method (aligner/models/base.py)
DEFAULT_ALIGNMENT_METHODS = {kind: cls.TRANSLATE_ALIGNMENT_METHOD or cls.METHODS[0]
                             for kind, cls in MODELS.items()}
MAX_WARNINGS = 10
#: hmm0/hmm1 decoding: most lexicon logits (floats) one step computes at a time, in chunks of
#: source positions (a chunk never has fewer than one position: N · V floats for N beam rows)
LEXICON_CHUNK_FLOATS = 1 << 22


# ---------------------------------------------------------------------------------------------
# Steppers: one model kind's next-token distribution, one position at a time
# ---------------------------------------------------------------------------------------------

def _select(value: Any, rows: torch.Tensor) -> Any:
    """Rows `rows` of a per-row tensor, or of each tensor in a list (leading dim = rows)."""
    if isinstance(value, torch.Tensor):
        return value.index_select(0, rows)
    if isinstance(value, list):
        return [_select(item, rows) for item in value]
    return value


class Stepper:
    """Incremental decoder of one model kind (see the module docstring).

    Subclasses set ``embed`` (the target :class:`~aligner.models.transformer.Embedding`) and
    ``layers`` (the decoder layers, the last included), and implement ``encode`` (state with
    the encoder ``memory`` (N, J+1, d)), ``_layer(index, x, history, state)`` (one layer on
    the newest position x (N, 1, d), keys/values from ``history``) and ``_output(last,
    state, step)`` (log-probabilities (N, V) from the last layer's output).
    """

    def __init__(self, model: AlignmentModel):
        self.model = model
        self.markov_order = int(model.config.markov_order)
        self.vocab_size = int(model.config.tgt_vocab_size)

    # -- to be provided per kind ------------------------------------------------------------
    embed: Any
    layers: Sequence[torch.nn.Module]

    def encode(self, src: torch.Tensor) -> State:
        raise NotImplementedError

    def _layer(self, index: int, x: torch.Tensor, history: torch.Tensor, state: State) -> Any:
        raise NotImplementedError

    def _output(self, last: Any, state: State, step: int) -> torch.Tensor:
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------------
    def start(self, src: torch.Tensor) -> State:
        """State of N hypotheses from their sources src (N, J+1) (ids + EOS, right-padded)."""
        state = self.encode(src)
        state["src_pad_mask"] = src.eq(C.PAD_ID)
        empty = state["memory"].new_zeros((src.size(0), 0, state["memory"].size(-1)))
        if self.markov_order > 0:
            state["static"] = empty
        else:
            state["history"] = [empty] * len(self.layers)
        return state

    def log_probs(self, state: State, tokens: torch.Tensor, step: int) -> torch.Tensor:
        """log p(next token) (N, V) float32 given the newest tokens (N,) at position `step`
        (0 = BOS). Appends this position to the state's history."""
        x = self.embed(tokens[:, None], offset=step)                          # (N, 1, d)
        if self.markov_order > 0:
            state["static"] = torch.cat([state["static"], x], 1)[:, -self.markov_order:]
        for index in range(len(self.layers)):
            if self.markov_order > 0:
                history = state["static"]
            else:
                history = torch.cat([state["history"][index], x], 1)
                state["history"][index] = history
            x = self._layer(index, x, history, state)
        return self._output(x, state, step)

    def choose(self, state: State, rows: torch.Tensor, words: torch.Tensor) -> State:
        """Keep hypotheses `rows` (N',) of the state, extended by `words` (N',)."""
        return {key: _select(value, rows) for key, value in state.items()
                if not key.startswith("pending")}


class TransformerStepper(Stepper):
    """The transformer baseline (and the frozen base of an alignment-layer model)."""

    def __init__(self, model: AlignmentModel):
        # alignment-layer: translate with its frozen base transformer
        base = model.base if isinstance(model, AlignmentLayerModel) else model
        super().__init__(base)
        self.embed = base.decoder.embed
        self.layers = base.decoder.layers

    def encode(self, src: torch.Tensor) -> State:
        return {"memory": self.model.encode(src)}

    def _layer(self, index, x, history, state):
        x, _ = self.layers[index](x, state["memory"], None, state["src_pad_mask"], False, history)
        return x

    def _output(self, last, state, step):
        logits = self.model.logits(self.model.decoder.norm(last))[:, -1]
        return torch.log_softmax(logits.float(), dim=-1)


def mixture_log_probs(log_prior: torch.Tensor, source_hidden: torch.Tensor,
                      target_hidden: torch.Tensor, weight: torch.Tensor,
                      bias: Optional[torch.Tensor], positions: int
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The direct HMM's word distribution at one target position, source positions chunked.

    log p(v) = logsumexp_j (log π(j) + log p_lex(v|j)) with
    log p_lex(v|j) = logit(v|j) − log Σ_v' exp(logit(v'|j)),
    logit(·|j) = W4·relu(W5·h_j + W6·s).

    Args:
        log_prior: (N, J+1) log π(j) (−inf at padded positions), float32.
        source_hidden: (N, J+1, k) W5·h_j; target_hidden: (N, k) W6·s of the newest position.
        weight, bias: W4 (V, k) and its bias (V,) or None.
        positions: source positions per chunk (>= 1): only (N, positions, V) logits exist at
            a time; the chunks are combined by a running logsumexp.
    Returns:
        (log p (N, V), log normalizers log Σ_v exp(logit(v|j)) (N, J+1)), float32.
    """
    total: Optional[torch.Tensor] = None
    norms = []
    for start in range(0, log_prior.size(1), positions):
        stop = start + positions
        hidden = F.relu(source_hidden[:, start:stop] + target_hidden[:, None, :])  # (N, c, k)
        logits = F.linear(hidden, weight, bias).float()                            # (N, c, V)
        log_norm = torch.logsumexp(logits, dim=-1)                                 # (N, c)
        logits += (log_prior[:, start:stop] - log_norm)[:, :, None]   # log π + log p_lex
        part = torch.logsumexp(logits, dim=1)                                      # (N, V)
        total = part if total is None else torch.logaddexp(total, part)
        norms.append(log_norm)
    assert total is not None, "no source positions"
    return total, torch.cat(norms, dim=1)


class DirectHMMStepper(Stepper):
    """hmm0 and hmm1: the beam runs over the word distribution Σ_j α · p_lex.

    Memory per step: the lexicon logits exist for ``positions`` source positions at a time,
    positions = max(1, chunk_floats // (N · V)) (N beam rows, V words), so one step holds
    about max(chunk_floats, N · V) floats of them, whatever the source length (see
    :func:`mixture_log_probs`; eval/results/translate_memory.md). hmm1's ``choose`` needs
    log p_lex(e|j) of the chosen words only: it recomputes those (N', J+1) entries from the
    kept rows' hidden states and the saved log normalizers instead of keeping (N, J+1, V).
    """

    def __init__(self, model: AlignmentModel, chunk_floats: int = LEXICON_CHUNK_FLOATS):
        super().__init__(model)
        check_condition(chunk_floats >= 1, f"chunk_floats must be >= 1 (got {chunk_floats})")
        self.order = model.order
        self.embed = model.embed
        self.layers = list(model.layers) + [model.output_layer]
        self.chunk_floats = chunk_floats

    def encode(self, src: torch.Tensor) -> State:
        memory = self.model.encode(src)
        if self.order == 0:
            return {"memory": memory}
        # hmm1's alignment keys (N, J+1, J, d) depend on the source only: computed once here
        # and selected with the beam rows, not recomputed at every output position
        return {"memory": memory,
                "alignment_keys": self.model.output_layer.first_order.keys(memory)}

    def _layer(self, index, x, history, state):
        if index == len(self.layers) - 1 and self.order == 1:
            return self.layers[index](x, state["memory"], None, state["src_pad_mask"], history,
                                      state["alignment_keys"])
        return self.layers[index](x, state["memory"], None, state["src_pad_mask"], history)

    def _output(self, last, state, step):
        log_alpha, source_hidden, target_hidden = last
        if self.order == 0:
            log_prior = log_alpha[:, -1]                                      # (N, J+1)
        elif step == 0:
            log_prior = log_alpha[:, -1, 0]                                   # α(j | 0, start)
        else:                                                  # Σ_j' q(j') α(j | i, j')
            log_prior = torch.logsumexp(state["forward"][:, :, None] + log_alpha[:, -1, 1:], 1)
        rows = log_prior.size(0)
        positions = max(1, self.chunk_floats // max(1, rows * self.vocab_size))
        log_p, log_norm = mixture_log_probs(log_prior, source_hidden, target_hidden[:, -1],
                                            self.model.lexicon.weight,
                                            self.model.lexicon.bias, positions)
        if self.order == 1:
            state["pending"] = (log_prior, log_norm, source_hidden, target_hidden[:, -1])
        return log_p

    def choose(self, state, rows, words):
        kept = super().choose(state, rows, words)
        if self.order == 1:
            # q_i(j) = π_i(j) p_lex(e|j) / p(e) for the chosen e, normalized over j (p(e) is
            # that sum); log p_lex(e|j) = logit(e|j) − log norm(j), (N', J+1) entries only
            log_prior, log_norm, source_hidden, target_hidden = (
                _select(value, rows) for value in state["pending"])
            hidden = F.relu(source_hidden + target_hidden[:, None, :])       # (N', J+1, k)
            weight = self.model.lexicon.weight.index_select(0, words)          # (N', k)
            logit = torch.einsum("njk,nk->nj", hidden, weight).float()
            if self.model.lexicon.bias is not None:
                logit = logit + self.model.lexicon.bias.index_select(0, words)[:, None].float()
            kept["forward"] = torch.log_softmax(log_prior + logit - log_norm, dim=-1)
        return kept


def make_stepper(model: AlignmentModel) -> Stepper:
    """The stepper of `model`'s kind: the direct HMMs' own, else a transformer's."""
    if isinstance(model, DirectHMM):
        return DirectHMMStepper(model)
    return TransformerStepper(model)


# ---------------------------------------------------------------------------------------------
# Beam search
# ---------------------------------------------------------------------------------------------

@dataclass
class Hypothesis:
    """A finished translation in subword ids: ``tokens`` without EOS; ``log_prob`` = Σ log p
    over the tokens and EOS; ``score`` = log_prob / (len(tokens) + 1) ** len_penalty."""

    tokens: List[int]
    score: float
    log_prob: float


def max_output_length(source_length: int, max_len_a: float, max_len_b: int,
                      max_positions: Optional[int]) -> int:
    """Most output subwords (EOS not counted) for a source of `source_length` subwords."""
    length = int(max_len_a * source_length + max_len_b)
    if max_positions is not None:
        length = min(length, max_positions - 1)      # BOS + output must fit the positions
    return max(length, 0)


@torch.no_grad()
def beam_search(stepper: Stepper, src: torch.Tensor, max_lengths: Sequence[int],
                beam: int = DEFAULT_BEAM, len_penalty: float = DEFAULT_LEN_PENALTY,
                min_lengths: Optional[Sequence[int]] = None) -> List[Hypothesis]:
    """The best hypothesis per sentence of src (B, J+1) (ids + EOS, right-padded).

    max_lengths[b]: most output subwords of sentence b (at that step only EOS is allowed);
    min_lengths[b] (optional): fewest output subwords (EOS is banned before; min = max gives
    outputs of a fixed length, e.g. to time decoding at equal output length).
    """
    check_condition(beam >= 1, f"--beam must be at least 1 (got {beam})")
    device = src.device
    n_sentences, vocab = src.size(0), stepper.vocab_size
    sentence_ids = torch.arange(n_sentences, device=device)       # sentence of each group
    limits = torch.as_tensor(list(max_lengths), device=device, dtype=torch.long)
    minimum = torch.as_tensor(list(min_lengths) if min_lengths is not None
                              else [0] * n_sentences, device=device, dtype=torch.long)
    # encode each sentence once, then copy its state to its K beam rows
    state = {key: _select(value, torch.arange(n_sentences, device=device).repeat_interleave(
        beam)) for key, value in stepper.start(src).items()}
    tokens = torch.full((n_sentences * beam, 1), C.BOS_ID, dtype=torch.long, device=device)
    scores = torch.full((n_sentences, beam), -math.inf, device=device)
    scores[:, 0] = 0.0                              # identical beams: start from one of them
    finished: List[List[Hypothesis]] = [[] for _ in range(n_sentences)]
    banned = torch.zeros(vocab, dtype=torch.bool, device=device)
    banned[[C.PAD_ID, C.BOS_ID]] = True
    not_eos = torch.arange(vocab, device=device).ne(C.EOS_ID)
    step = 0
    while sentence_ids.numel() > 0:
        n = sentence_ids.numel()
        log_p = stepper.log_probs(state, tokens[:, -1], step).masked_fill(banned, -math.inf)
        at_limit = (limits[sentence_ids] <= step).repeat_interleave(beam)   # (n*K,)
        log_p = log_p.masked_fill(at_limit[:, None] & not_eos[None, :], -math.inf)
        too_short = (minimum[sentence_ids] > step).repeat_interleave(beam) & ~at_limit
        log_p[:, C.EOS_ID] = log_p[:, C.EOS_ID].masked_fill(too_short, -math.inf)
        candidates = (scores[:, :, None] + log_p.view(n, beam, vocab)).view(n, -1)
        top_scores, top_index = candidates.topk(min(2 * beam, beam * vocab), dim=1)
        origin, words = top_index // vocab, top_index % vocab                # (n, 2K)
        is_eos = words.eq(C.EOS_ID) & torch.isfinite(top_scores)
        # hypotheses ending here: EOS among the first K candidates
        ending = is_eos[:, :beam].nonzero().tolist()
        if ending:
            top_list, origin_list = top_scores.tolist(), origin.tolist()
            for group, rank in ending:
                sentence = int(sentence_ids[group])
                if len(finished[sentence]) >= beam:
                    continue
                row = group * beam + origin_list[group][rank]
                log_prob = top_list[group][rank]
                finished[sentence].append(Hypothesis(
                    tokens[row, 1:].tolist(), log_prob / (step + 1) ** len_penalty, log_prob))
        # the K best non-EOS extensions continue
        keep_scores = top_scores.masked_fill(words.eq(C.EOS_ID), -math.inf)
        next_scores, pick = keep_scores.topk(beam, dim=1)                    # (n, K)
        rows = (torch.arange(n, device=device)[:, None] * beam
                + origin.gather(1, pick))                                    # (n, K)
        next_words = words.gather(1, pick)
        done = torch.tensor([len(finished[int(s)]) >= beam for s in sentence_ids.tolist()],
                            dtype=torch.bool, device=device)
        done |= limits[sentence_ids] <= step
        alive = (~done).nonzero().squeeze(1)
        rows, next_words = rows[alive].reshape(-1), next_words[alive].reshape(-1)
        state = stepper.choose(state, rows, next_words)
        tokens = torch.cat([tokens.index_select(0, rows), next_words[:, None]], dim=1)
        scores, sentence_ids = next_scores[alive], sentence_ids[alive]
        step += 1
    return [max(hypotheses, key=lambda h: h.score) for hypotheses in finished]


# ---------------------------------------------------------------------------------------------
# Words in, words out
# ---------------------------------------------------------------------------------------------

def join_subwords(pieces: Sequence[str]) -> Tuple[List[str], List[int]]:
    """Undo BPE: words and, per piece, the index of the word it belongs to.

    A piece ending in "@@" continues into the next one; a dangling final "@@" piece just
    ends its word (the marker is dropped).
    """
    words: List[str] = []
    word_index: List[int] = []
    continuing = False
    for piece in pieces:
        continues = piece.endswith(C.BPE_SEPARATOR)
        text = piece[: -len(C.BPE_SEPARATOR)] if continues else piece
        if continuing:
            words[-1] += text
        else:
            words.append(text)
        word_index.append(len(words) - 1)
        continuing = continues
    return words, word_index


@dataclass
class Translation:
    """One input line's translation.

    words: output words (BPE undone); subwords: the output BPE units; score / log_prob: of
    the hypothesis (see :class:`Hypothesis`; 0 for an empty input); links: (input word,
    output word) pairs, 0-based, when an alignment was asked for, else None.
    """

    words: List[str]
    subwords: List[str] = field(default_factory=list)
    score: float = 0.0
    log_prob: float = 0.0
    links: Optional[Set[Link]] = None

    @property
    def text(self) -> str:
        return " ".join(self.words)


@dataclass
class EncodedInput:
    """One input line: words, BPE subwords' ids (no EOS) and each subword's word index."""

    words: List[str]
    ids: np.ndarray
    word_index: List[int]


def encode_inputs(loaded: LoadedModelDir, lines: Sequence[str], direction: str
                  ) -> List[EncodedInput]:
    """Tokenize (when the model was trained with --tokenize/--lowercase), BPE and encode lines
    of the model's input language: the source language for fwd, the target language for rev."""
    pre = loaded.preprocessor
    side, vocab = ("src", loaded.src_vocab) if direction == "fwd" else ("tgt", loaded.tgt_vocab)
    inputs = []
    for line in lines:
        if pre.config.tokenize or pre.config.lowercase:
            words = pre.tokenize_line(line, side)
        else:
            words = split_words(line)
        segmented = pre.segment(words, side)
        inputs.append(EncodedInput(words, np.asarray(vocab.encode(segmented.subwords),
                                                     dtype=np.int64), segmented.word_index))
    return inputs


def _source_tensor(inputs: Sequence[EncodedInput], device: torch.device) -> torch.Tensor:
    """(B, J+1) ids + EOS, right-padded."""
    width = max(len(item.ids) for item in inputs) + 1
    src = torch.full((len(inputs), width), C.PAD_ID, dtype=torch.long)
    for row, item in enumerate(inputs):
        src[row, :len(item.ids)] = torch.from_numpy(item.ids)
        src[row, len(item.ids)] = C.EOS_ID
    return src.to(device)


@torch.no_grad()
def align_outputs(model: AlignmentModel, inputs: Sequence[EncodedInput],
                  outputs: Sequence[Sequence[int]], output_word_index: Sequence[Sequence[int]],
                  method: str, device: torch.device) -> List[Set[Link]]:
    """Word links (input word, output word) of each input with its output subword ids, by
    force-decoding the outputs and extracting with `method` (see aligner.inference)."""
    batch = make_batch([item.ids for item in inputs], [list(out) for out in outputs],
                       "fwd").to(device)
    path = hard_alignment(model, batch.src, batch.tgt_in, batch.tgt_out, method).cpu().tolist()
    links = []
    for row, item in enumerate(inputs):
        subword_links = [(j, i) for i, j in enumerate(path[row]) if j >= 0]
        links.append(subword_to_word_links(subword_links, item.word_index,
                                           output_word_index[row]))
    return links


@torch.no_grad()
def translate_inputs(model: AlignmentModel, inputs: Sequence[EncodedInput],
                     output_tokens: Sequence[str], beam: int = DEFAULT_BEAM,
                     max_len_a: float = DEFAULT_MAX_LEN_A, max_len_b: int = DEFAULT_MAX_LEN_B,
                     len_penalty: float = DEFAULT_LEN_PENALTY,
                     max_tokens: int = DEFAULT_MAX_TOKENS,
                     alignment_method: Optional[str] = None,
                     device: Optional[torch.device] = None,
                     input_name: str = "-") -> List[Translation]:
    """Translate encoded inputs with one direction's model, in input order.

    output_tokens: the output vocabulary's tokens in id order (to undo BPE). Batches group
    inputs of similar length (beam × padded source positions <= max_tokens) and results come
    back in input order. An empty input, or one longer than the model's max_positions, gets
    an empty translation and a warning naming `input_name` and the line.
    """
    device = device or next(model.parameters()).device
    model.eval()
    stepper = make_stepper(model)
    if alignment_method is not None:
        check_condition(alignment_method in model.METHODS,
                        f"unknown alignment method '{alignment_method}' for this model "
                        f"(choose from {', '.join(model.METHODS)})")
    limit = model_max_positions(model)
    results = [Translation([], links=set() if alignment_method else None) for _ in inputs]
    usable, n_skipped = [], 0
    for line_no, item in enumerate(inputs, start=1):
        if len(item.ids) > 0 and (limit is None or len(item.ids) + 1 <= limit):
            usable.append(line_no - 1)
            continue
        n_skipped += 1
        if n_skipped <= MAX_WARNINGS:
            reason = ("an empty line" if len(item.ids) == 0 else
                      f"{len(item.ids) + 1} positions > the model's limit of {limit}")
            logger.warning("%s:%d: %s: writing an empty translation", input_name, line_no,
                           reason)
    if n_skipped > MAX_WARNINGS:
        logger.warning("%d lines in all get an empty translation (only the first %d are "
                       "listed)", n_skipped, MAX_WARNINGS)
    if not usable:
        return results
    widths = [len(inputs[k].ids) + 1 for k in usable]
    batches = inference_batches(len(usable), widths, max(1, max_tokens // beam))
    batch_results = []
    for batch_indices in batches:
        items = [inputs[usable[b]] for b in batch_indices]
        lengths = [max_output_length(len(item.ids), max_len_a, max_len_b, limit)
                   for item in items]
        hypotheses = beam_search(stepper, _source_tensor(items, device), lengths, beam,
                                 len_penalty)
        translations = []
        for hypothesis in hypotheses:
            subwords = [output_tokens[t] for t in hypothesis.tokens]
            words, _ = join_subwords(subwords)
            translations.append(Translation(words, subwords, hypothesis.score,
                                            hypothesis.log_prob))
        if alignment_method is not None:
            indices = [join_subwords(t.subwords)[1] for t in translations]
            links = align_outputs(model, items, [h.tokens for h in hypotheses], indices,
                                  alignment_method, device)
            for translation, pair_links in zip(translations, links):
                translation.links = pair_links
        batch_results.append(translations)
    for k, translation in zip(usable, restore_order(batches, batch_results)):
        results[k] = translation
    return results


def translate(loaded: LoadedModelDir, lines: Sequence[str], direction: str = "fwd",
              beam: int = DEFAULT_BEAM, max_len_a: float = DEFAULT_MAX_LEN_A,
              max_len_b: int = DEFAULT_MAX_LEN_B, len_penalty: float = DEFAULT_LEN_PENALTY,
              max_tokens: int = DEFAULT_MAX_TOKENS, print_alignment: bool = False,
              alignment_method: Optional[str] = None, device: Optional[torch.device] = None,
              input_name: str = "-") -> List[Translation]:
    """Translate lines of plain (tokenized) text with a model directory's `direction` model.

    fwd translates source-language lines into the target language, rev the other way round.
    With ``print_alignment`` each translation carries its word links (alignment_method, or
    the kind's default from :data:`DEFAULT_ALIGNMENT_METHODS`). One result per line, in order.
    """
    check_condition(direction in loaded.models,
                    f"{loaded.path}: no '{direction}' model loaded (have "
                    f"{', '.join(loaded.models)})")
    model = loaded.models[direction]
    if print_alignment and alignment_method is None:
        alignment_method = DEFAULT_ALIGNMENT_METHODS.get(loaded.config.model_kind,
                                                         model.METHODS[0])
    output_vocab = loaded.tgt_vocab if direction == "fwd" else loaded.src_vocab
    start = time.time()
    inputs = encode_inputs(loaded, lines, direction)
    results = translate_inputs(model, inputs, output_vocab.tokens, beam, max_len_a, max_len_b,
                               len_penalty, max_tokens,
                               alignment_method if print_alignment else None, device,
                               input_name)
    seconds = time.time() - start
    n_subwords = sum(len(t.subwords) for t in results)
    device_type = (device or next(model.parameters()).device).type
    precision = "fp32"                       # or autocast's (aligner.precision: bf16)
    if torch.is_autocast_enabled(device_type):
        precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(
            torch.get_autocast_dtype(device_type), "autocast")
    logger.info("translated %d lines (%s, beam %d, %s) into %d subwords in %.1fs (%.1f "
                "lines/s, %.0f subwords/s)", len(lines), direction, beam, precision, n_subwords,
                seconds, len(lines) / max(seconds, 1e-9), n_subwords / max(seconds, 1e-9))
    return results
