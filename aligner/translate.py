"""Translation by beam search with a trained model of any kind, and word alignments of the output.

Returns objects and never writes files (the CLI, aligner/cli/translate.py, prints them).

**Incremental decoding** is the model's own (the decode contract of aligner/models/base.py:
``init_decode_state`` encodes the sources, ``decode_step`` reads the newest token of every
hypothesis and returns log p(next token | prefix, source) (N, V) for the last position only,
``reorder_decode_state`` keeps the rows the search picked). Each kind implements it next to its
full-sequence forward (aligner/models/transformer.py, direct_hmm.py; the alignment layer
translates with its frozen base transformer); this module knows nothing of model internals.

**Beam search** (fairseq-style, batched over sentences): each step takes the 2K best
extensions of the K hypotheses of every sentence; an extension by EOS among the first K
ends a hypothesis (score = Σ log p / length^len_penalty, length counting EOS); the K best
non-EOS extensions continue. A sentence is done when it has K ended hypotheses; at its
maximum length (``max_len_a`` · source subwords + ``max_len_b``, capped by the model's
``max_positions``) only EOS is allowed. PAD and BOS are never generated. With K = 1 this is
greedy search. Finished sentences leave the batch.

**Precision.** Run under :func:`aligner.precision.autocast_context` (``align translate
--precision bf16``) the models' matmuls are bfloat16, while every kind's ``decode_step``
returns float32 log-probabilities (each casts before its log_softmax / logsumexp), so the
beam's running scores and the finished hypotheses' log-probabilities are float32 sums.

**Alignments** (``alignment_method``): after the search, the chosen output is force-decoded
through :func:`aligner.extract.inference.hard_alignment` — for a causal model its alignment of
output word i equals what it computed while generating i (the guided alignment layer also
reads the words after i). Defaults
(:func:`default_alignment_method`): transformer ``attention`` (penultimate decoder layer,
heads averaged, like ``align extract --method attention``); hmm0 ``hmm-posterior`` (argmax_j
α(j|i)·p_lex(e_i|j) at the chosen word); hmm1 ``hmm-viterbi`` (the back-trace of the best
final state, over the whole output); alignment-layer ``layer-sgd``, and ``layer`` for the
guided layer (``--layer-query target``: :func:`default_alignment_method` reads the loaded
model's own methods). Links are between input
words and output words (BPE undone; words are linked if any of their subwords are), as
(input word, output word), 0-based; links to EOS are never output. With a Moses
``heuristic`` (``align translate -H``) the other direction's model force-decodes the input
given the output and the two alignments are symmetrized as ``align extract -H`` does
(:func:`symmetrize_translations`).
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import torch

from aligner import constants as C
from aligner.data import make_batch, subword_to_word_links
from aligner.extract.inference import batched, hard_alignment, model_max_positions
from aligner.model_dir import LoadedModelDir
from aligner.models.base import AlignmentModel, model_device
from aligner.precision import active_autocast_dtype
from aligner.prep import split_words
from aligner.utils import check_condition

logger = logging.getLogger(__name__)

Link = Tuple[int, int]

DEFAULT_BEAM = 5
DEFAULT_MAX_LEN_A = 1.5
DEFAULT_MAX_LEN_B = 10
DEFAULT_LEN_PENALTY = 1.0
#: beam rows × padded source positions per batch
DEFAULT_MAX_TOKENS = 8000
MAX_WARNINGS = 10


def default_alignment_method(model) -> str:
    """`--print-alignment`'s method for a loaded model: its kind's ``TRANSLATE_ALIGNMENT_METHOD``,
    else the model's first method (an instance may order its methods by its config: the guided
    alignment layer puts ``layer`` first)."""
    return model.TRANSLATE_ALIGNMENT_METHOD or model.METHODS[0]


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
def beam_search(model: AlignmentModel, src: torch.Tensor, max_lengths: Sequence[int],
                beam: int = DEFAULT_BEAM, len_penalty: float = DEFAULT_LEN_PENALTY,
                min_lengths: Optional[Sequence[int]] = None,
                decode_options: Optional[Dict[str, Any]] = None) -> List[Hypothesis]:
    """The best hypothesis per sentence of src (B, J+1) (ids + EOS, right-padded).

    model: anything with the decode contract of aligner/models/base.py (``init_decode_state``,
    ``decode_step``, ``reorder_decode_state``); the vocabulary is the last dim of its
    log-probabilities. max_lengths[b]: most output subwords of sentence b (at that step only
    EOS is allowed); min_lengths[b] (optional): fewest output subwords (EOS is banned before;
    min = max gives outputs of a fixed length, e.g. to time decoding at equal output length).
    decode_options: the kind's options of ``init_decode_state`` (none by default).
    """
    check_condition(beam >= 1, f"--beam must be at least 1 (got {beam})")
    device = src.device
    n_sentences = src.size(0)
    sentence_ids = torch.arange(n_sentences, device=device)       # sentence of each group
    limits = torch.as_tensor(list(max_lengths), device=device, dtype=torch.long)
    minimum = torch.as_tensor(list(min_lengths) if min_lengths is not None
                              else [0] * n_sentences, device=device, dtype=torch.long)
    # encode each sentence once, then copy its state to its K beam rows
    state = model.reorder_decode_state(
        model.init_decode_state(src, **(decode_options or {})),
        torch.arange(n_sentences, device=device).repeat_interleave(beam))
    tokens = torch.full((n_sentences * beam, 1), C.BOS_ID, dtype=torch.long, device=device)
    scores = torch.full((n_sentences, beam), -math.inf, device=device)
    scores[:, 0] = 0.0                              # identical beams: start from one of them
    finished: List[List[Hypothesis]] = [[] for _ in range(n_sentences)]
    step = 0
    while sentence_ids.numel() > 0:
        n = sentence_ids.numel()
        log_p, state = model.decode_step(state, tokens[:, -1])
        if step == 0:
            vocab = log_p.size(-1)
            banned = torch.zeros(vocab, dtype=torch.bool, device=device)
            banned[[C.PAD_ID, C.BOS_ID]] = True
            not_eos = torch.arange(vocab, device=device).ne(C.EOS_ID)
        log_p = log_p.masked_fill(banned, -math.inf)
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
        state = model.reorder_decode_state(state, rows)
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
    force-decoding the outputs and extracting with `method` (see aligner.extract.inference)."""
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
    device = device or model_device(model)
    model.eval()
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
    widths = [len(inputs[k].ids) + 1 for k in usable]
    for indices, src in batched(inputs, usable, widths, max(1, max_tokens // beam),
                                lambda items: _source_tensor(items, device)):
        items = [inputs[k] for k in indices]
        lengths = [max_output_length(len(item.ids), max_len_a, max_len_b, limit)
                   for item in items]
        hypotheses = beam_search(model, src, lengths, beam, len_penalty)
        translations = []
        for hypothesis in hypotheses:
            subwords = [output_tokens[t] for t in hypothesis.tokens]
            words, _ = join_subwords(subwords)
            translations.append(Translation(words, subwords, hypothesis.score,
                                            hypothesis.log_prob))
        if alignment_method is not None:
            word_indices = [join_subwords(t.subwords)[1] for t in translations]
            links = align_outputs(model, items, [h.tokens for h in hypotheses], word_indices,
                                  alignment_method, device)
            for translation, pair_links in zip(translations, links):
                translation.links = pair_links
        for k, translation in zip(indices, translations):
            results[k] = translation
    return results


def _flip(links: Set[Link]) -> Set[Link]:
    return {(b, a) for a, b in links}


def symmetrize_translations(loaded: LoadedModelDir, inputs: Sequence[EncodedInput],
                            results: Sequence[Translation], direction: str, method: str,
                            heuristic: str, device: Optional[torch.device] = None,
                            max_tokens: int = DEFAULT_MAX_TOKENS, input_name: str = "-") -> None:
    """Replace each translation's links by the symmetrization of both directions' alignments.

    The translating model's links (``results[k].links``, input word → output word) are combined
    by `heuristic` (aligner.links.symmetrize) with those of the other direction's model, which
    force-decodes the input given the output (its source = the output's subwords as generated,
    its target = the input's). As in ``align extract``, the forward alignment is the one of
    p(target language | source language): for ``direction`` fwd that is the translating model,
    for rev the other one. The result is what ``align extract -m METHOD -H HEURISTIC`` prints
    for (input, output) — for rev, for (output, input), flipped — when the output re-encodes to
    the generated subwords. Translations with no words keep no links.
    """
    from aligner.links.symmetrize import symmetrize

    other = "rev" if direction == "fwd" else "fwd"
    check_condition(other in loaded.models,
                    f"{loaded.path}: symmetrizing a translation's alignment needs the "
                    f"'{other}' model too (have {', '.join(loaded.models)})")
    model = loaded.models[other]
    model.eval()
    check_condition(method in model.METHODS,
                    f"unknown alignment method '{method}' for the '{other}' model "
                    f"(choose from {', '.join(model.METHODS)})")
    device = device or model_device(model)
    limit = model_max_positions(model)
    rows, widths, too_long = [], [], []     # widths[n]: positions of the pair of rows[n]
    for k, result in enumerate(results):
        if not result.subwords:
            continue
        width = max(len(result.subwords), len(inputs[k].ids)) + 1
        if limit is None or width <= limit:
            rows.append(k)
            widths.append(width)
        else:
            too_long.append(k)
    for k in too_long:      # as align extract leaves a pair out that a model cannot take
        results[k].links = set()
    if too_long:
        logger.warning("%s:%d: the translation is too long for the '%s' model (max_positions "
                       "%d): printed without links (%d such lines in all)", input_name,
                       too_long[0] + 1, other, limit, len(too_long))
    vocab = loaded.tgt_vocab if direction == "fwd" else loaded.src_vocab   # the output's
    outputs = []
    for k in rows:
        ids = np.asarray(vocab.encode(results[k].subwords), dtype=np.int64)
        outputs.append(EncodedInput(results[k].words, ids, join_subwords(results[k].subwords)[1]))
    # one row per sentence here (the search's batches hold beam rows per sentence)
    for indices, _ in batched(outputs, list(range(len(rows))), widths, max_tokens,
                              lambda items: None):
        other_links = align_outputs(model, [outputs[n] for n in indices],
                                    [inputs[rows[n]].ids.tolist() for n in indices],
                                    [inputs[rows[n]].word_index for n in indices], method,
                                    device)
        for n, links in zip(indices, other_links):
            result = results[rows[n]]
            own, theirs = result.links or set(), _flip(links)      # both (input, output)
            if direction == "fwd":      # forward = p(target language | source language)
                result.links = symmetrize(own, theirs, heuristic)
            else:
                result.links = _flip(symmetrize(_flip(theirs), _flip(own), heuristic))


def translate(loaded: LoadedModelDir, lines: Sequence[str], direction: str = "fwd",
              beam: int = DEFAULT_BEAM, max_len_a: float = DEFAULT_MAX_LEN_A,
              max_len_b: int = DEFAULT_MAX_LEN_B, len_penalty: float = DEFAULT_LEN_PENALTY,
              max_tokens: int = DEFAULT_MAX_TOKENS, print_alignment: bool = False,
              alignment_method: Optional[str] = None, device: Optional[torch.device] = None,
              input_name: str = "-", heuristic: Optional[str] = None) -> List[Translation]:
    """Translate lines of plain (tokenized) text with a model directory's `direction` model.

    fwd translates source-language lines into the target language, rev the other way round.
    With ``print_alignment`` each translation carries its word links (alignment_method, or
    the model's default, :func:`default_alignment_method`); with a ``heuristic`` too, the
    links combine both directions' alignments of (input, output)
    (:func:`symmetrize_translations`; `loaded` must hold both models). One result per line,
    in order.
    """
    check_condition(direction in loaded.models,
                    f"{loaded.path}: no '{direction}' model loaded (have "
                    f"{', '.join(loaded.models)})")
    model = loaded.models[direction]
    if print_alignment and alignment_method is None:
        alignment_method = default_alignment_method(model)
    output_vocab = loaded.tgt_vocab if direction == "fwd" else loaded.src_vocab
    start = time.time()
    inputs = encode_inputs(loaded, lines, direction)
    results = translate_inputs(model, inputs, output_vocab.tokens, beam, max_len_a, max_len_b,
                               len_penalty, max_tokens,
                               alignment_method if print_alignment else None, device,
                               input_name)
    if print_alignment and heuristic is not None:
        symmetrize_translations(loaded, inputs, results, direction, alignment_method, heuristic,
                                device, max_tokens, input_name)
    seconds = time.time() - start
    n_subwords = sum(len(t.subwords) for t in results)
    device_type = (device or model_device(model)).type
    autocast = active_autocast_dtype(device_type)   # aligner.precision: bf16, or none
    precision = ("fp32" if autocast is None else
                 {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(autocast, "autocast"))
    logger.info("translated %d lines (%s, beam %d, %s) into %d subwords in %.1fs (%.1f "
                "lines/s, %.0f subwords/s)", len(lines), direction, beam, precision, n_subwords,
                seconds, len(lines) / max(seconds, 1e-9), n_subwords / max(seconds, 1e-9))
    return results
