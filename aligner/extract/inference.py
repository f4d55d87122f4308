"""Alignment extraction: sentence pairs in, word-level link sets out (in input order).

The path of one pair: words --BPE--> subwords --ids--> model --scores (I+1, J+1)--> one source
subword per target subword (argmax, or a model's own hard path) --> subword links --> word
links (words are linked if any of their subwords are) --> source–target orientation.

Hooks for model kinds (see aligner/models/base.py for the tensor conventions):

* ``alignment_scores(src, tgt_in, tgt_out, method, **options) -> (B, I+1, J+1)`` (required):
  extraction takes, for every real target position i, argmax over the real source positions
  (EOS and padding are masked here, so models need not mask them).
* ``alignment_path(src, tgt_in, tgt_out, method, **options) -> LongTensor (B, I+1) or None``
  (optional; the base class returns None): a model that computes a hard alignment itself
  (e.g. a Viterbi path) returns, per target position i, the aligned source position j
  (0-based, in [0, J]) or -1 for "not aligned"; returning None falls back to the argmax of
  ``alignment_scores``. Links to the source EOS or padding, and links of the EOS/padding
  target rows, are dropped here.

Lines with an empty side, or too long for the model, get an empty alignment and a warning;
no line is ever dropped or shifted. This module returns objects and never writes files.
"""
from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple,
                    TypeVar, Union)

import numpy as np
import torch

from aligner import constants as C
from aligner.links.combine import combine, needs_soft
from aligner.data import (Batch, EncodedPair, encode_pair, inference_batches, make_batch,
                          subword_to_word_links)
from aligner.formats import Bitext
from aligner.links.soft_symmetrize import DEFAULT_THRESHOLD
from aligner.malloc import RELEASE_BATCHES, keep_freed_memory, release_free_memory
from aligner.model_dir import LoadedModelDir
from aligner.models.base import AlignmentModel, model_device
from aligner.precision import active_autocast_dtype
from aligner.utils import check_condition, sigterm_raises

logger = logging.getLogger(__name__)

Link = Tuple[int, int]
Item = TypeVar("Item")
Collated = TypeVar("Collated")
#: positions per inference batch on a GPU, and on a CPU, where small batches are faster: their
#: (B, I, J, ...) intermediates stay in cache (eval/results/extract_speed.md: hmm1 1.5-2x at
#: 500 than at 4,000 on one core; the transformer, hmm0 and the alignment layer gain too)
DEFAULT_MAX_TOKENS = 4000
CPU_MAX_TOKENS = 500
MAX_WARNINGS = 10
#: fewer pairs than this are aligned in this process even when ``parallel`` is asked for (the
#: two worker processes take a few seconds to start)
PARALLEL_MIN_PAIRS = 1000
#: the command line aligns a corpus in blocks of this many lines (aligner.formats.bitext_blocks),
#: writing each block's lines before reading the next, with one pair of DirectionWorkers for
#: all blocks: memory does not grow with the corpus (eval/results/memory_407k.md: 589 MiB peak
#: for 25k and for 110k lines at 10,000; 653 / 1,096 MiB at 50,000 with workers per block)
BLOCK_LINES = 10_000


def hard_alignment(model: AlignmentModel, src: torch.Tensor, tgt_in: torch.Tensor,
                   tgt_out: torch.Tensor, method: str, **options: Any) -> torch.Tensor:
    """Aligned source position per target position, (B, I+1) LongTensor, -1 = not aligned.

    Uses the model's ``alignment_path`` when it has one for `method`, else the argmax of
    ``alignment_scores`` over real source positions (for a model whose rows leave the
    unaligned mass, ``leaves_unaligned_mass``: only where the argmax's score is at least that
    mass, 1 − the row's sum). EOS/pad rows and columns never align.
    """
    src_real = src.ne(C.PAD_ID) & src.ne(C.EOS_ID)                   # (B, J+1)
    tgt_real = tgt_out.ne(C.PAD_ID) & tgt_out.ne(C.EOS_ID)           # (B, I+1)
    path = model.alignment_path(src, tgt_in, tgt_out, method, **options)
    if path is None:
        scores = model.alignment_scores(src, tgt_in, tgt_out, method, **options).float()
        scores = scores.masked_fill(~src_real[:, None, :], float("-inf"))
        best, path = scores.max(dim=-1)
        if model.leaves_unaligned_mass(method):
            unaligned = 1.0 - scores.clamp_min(0.0).sum(dim=-1)     # -inf → 0 in the sum
            path = path.masked_fill(best < unaligned, -1)
    path = path.long()
    inside = (path >= 0) & (path < src.size(1))
    real_column = torch.gather(src_real, 1, path.clamp(0, src.size(1) - 1))
    return torch.where(inside & real_column & tgt_real, path, torch.full_like(path, -1))


def progress_bar(total: int, description: str, enabled: bool):
    """A tqdm bar over `total` sentence pairs on stderr with rate and ETA (disabled: silent)."""
    from tqdm import tqdm
    return tqdm(total=total, desc=description, unit="pair", disable=not enabled,
                dynamic_ncols=True)


def _pair_links(path_row: np.ndarray, pair: EncodedPair, direction: str) -> Set[Link]:
    """Word links (source word, target word) of one pair from its hard path row (I+1,)."""
    subword_links = []
    for i, j in enumerate(path_row.tolist()):
        if j < 0:
            continue
        # fwd: decoder = target language (i), encoder = source language (j); rev: swapped
        subword_links.append((j, i) if direction == "fwd" else (i, j))
    return subword_to_word_links(subword_links, pair.src_word_index, pair.tgt_word_index)


def model_max_positions(model: AlignmentModel) -> Optional[int]:
    """Longest sequence (with BOS/EOS) the model accepts (its config's max_positions)."""
    return model.config.max_positions


def batched(items: Sequence[Item], indices: Sequence[int], widths: Sequence[int],
            max_tokens: int, collate: Callable[[List[Item]], Collated],
            description: str = "", progress: bool = False
            ) -> Iterator[Tuple[List[int], Collated]]:
    """The batch pipeline of inference, written once: the items ``items[k]`` for k in `indices`
    (those a model can take; widths[n]: the positions item indices[n] occupies) in batches of
    similar length, longest first, of at most `max_tokens` positions
    (:func:`aligner.data.inference_batches`); yields (the batch's indices into `items`,
    ``collate(its items)``).

    The indices are positions in `items`, so putting results back into input order is
    ``results[k] = result`` for each k of a batch (callers start from a list of defaults for
    the items left out). ``progress``: a tqdm bar (`description`) over the items, advanced
    when the caller asks for the next batch (none when there is nothing to batch).
    """
    if not indices:
        return
    batches = inference_batches(len(indices), widths, max_tokens)
    with progress_bar(len(indices), description, progress) as bar:
        for batch in batches:
            chosen = [indices[b] for b in batch]
            yield chosen, collate([items[k] for k in chosen])
            bar.update(len(chosen))


def default_max_tokens(device: torch.device, model: Optional[AlignmentModel] = None) -> int:
    """Positions per batch when the caller gives none: on a CPU the model kind's
    ``CPU_MAX_TOKENS`` (the classical aligner's) or else :data:`CPU_MAX_TOKENS`,
    :data:`DEFAULT_MAX_TOKENS` elsewhere."""
    if device.type != "cpu":
        return DEFAULT_MAX_TOKENS
    return getattr(model, "CPU_MAX_TOKENS", None) or CPU_MAX_TOKENS


def pair_batches(model: AlignmentModel, pairs: Sequence[EncodedPair], direction: str,
                 max_tokens: Optional[int] = None, device: Optional[torch.device] = None,
                 description: str = "", progress: bool = False
                 ) -> Iterator[Tuple[List[int], Batch]]:
    """(indices into `pairs`, :class:`aligner.data.Batch` of `direction` on `device`) for the
    pairs `model` can take (:func:`usable`; the others are in no batch), in length-sorted
    batches of at most `max_tokens` positions (see :func:`batched`; None: by the device,
    :func:`default_max_tokens`). `device`: the model's by default."""
    device = device or model_device(model)
    max_tokens = max_tokens or default_max_tokens(device, model)
    limit = model_max_positions(model)
    ok = [k for k, pair in enumerate(pairs) if usable(pair, limit)]

    def collate(items: List[EncodedPair]) -> Batch:
        return make_batch([p.src_ids for p in items], [p.tgt_ids for p in items],
                          direction).to(device)

    return batched(pairs, ok, [pairs[k].width for k in ok], max_tokens, collate, description,
                   progress)


@torch.no_grad()
def align_pairs(model: AlignmentModel, pairs: Sequence[EncodedPair], direction: str,
                method: str, max_tokens: Optional[int] = None,
                device: Optional[torch.device] = None,
                options: Optional[Dict[str, Any]] = None,
                progress: bool = False) -> List[Set[Link]]:
    """Word-level links of every pair with one direction's model, in input order.

    Links are (source word, target word) whatever the direction (rev links are flipped).
    Pairs with an empty side or longer than the model's max_positions get an empty set
    (the caller warns; see :func:`usable`). The model is put in eval mode. ``progress``: a
    tqdm bar on stderr.
    """
    check_condition(direction in C.DIRECTIONS, f"direction must be fwd or rev, not {direction}")
    check_condition(method in model.METHODS,
                    f"unknown method '{method}' for this model (choose from "
                    f"{', '.join(model.METHODS)})")
    options = options or {}
    model.eval()
    results: List[Set[Link]] = [set() for _ in pairs]
    for b, (indices, batch) in enumerate(pair_batches(model, pairs, direction, max_tokens,
                                                      device, f"align {direction}", progress)):
        path = hard_alignment(model, batch.src, batch.tgt_in, batch.tgt_out, method,
                              **options).cpu().numpy()
        for row, k in enumerate(indices):
            results[k] = _pair_links(path[row], pairs[k], direction)
        if (b + 1) % RELEASE_BATCHES == 0:
            release_free_memory()
    return results


#: the key under which a calibration record or a parts record names its subword pooling; a
#: record without it was made with the mean, as every record before the key
POOLING_KEY = "subword pooling"


def check_subword_pooling(pooling: str) -> None:
    """One error line unless `pooling` is one of constants.SUBWORD_POOLINGS."""
    check_condition(pooling in C.SUBWORD_POOLINGS,
                    f"subword pooling must be one of {', '.join(C.SUBWORD_POOLINGS)}, "
                    f"not {pooling!r}")


def pooling_entry(pooling: str) -> Dict[str, str]:
    """What a record holds of `pooling`: nothing for the mean (as a record from before the
    key), else :data:`POOLING_KEY`."""
    return {} if pooling == "mean" else {POOLING_KEY: pooling}


def recorded_pooling(record: Dict[str, Any]) -> str:
    """The subword pooling a record (of :func:`pooling_entry`) was made with."""
    return record.get(POOLING_KEY, "mean")


def word_matrix(scores: np.ndarray, pair: EncodedPair, direction: str,
                renormalize: bool = True, pooling: str = "mean") -> np.ndarray:
    """Word-level soft alignment (source words, target words) of one pair.

    scores (I+1, J+1): the model's scores in its own orientation (rows = decoder positions).
    Each real decoder subword's row is renormalized over the real encoder subwords (negative
    scores count as 0) and summed within each word of the encoder side. A decoder-side word's
    row is then its subwords' rows combined by `pooling` (constants.SUBWORD_POOLINGS):

    - ``mean``: the average subword's. For fwd every target word's column sums to 1 over the
      source words, for rev every source word's row sums to 1 over the target words; a word
      whose two subwords align to two words gets 0.5 for each.
    - ``max``: for each encoder-side word, the highest of its subwords' probabilities: the
      probability that the word has a subword aligned there where its subwords' alignments go
      together (as a first-order HMM's consecutive positions mostly do); the word above gets
      1 for each. A word of one subword gets the same row either way.

    Without ``renormalize`` (a model whose rows sum to p(aligned): ``leaves_unaligned_mass``
    of the model and method, aligner/models/base.py) the rows are taken as they are: under
    ``mean`` a column (fwd) / row (rev) sums to p(word aligned).
    """
    check_subword_pooling(pooling)
    enc_words, dec_words = ((pair.src_word_index, pair.tgt_word_index) if direction == "fwd"
                            else (pair.tgt_word_index, pair.src_word_index))
    rows = np.clip(scores[:len(dec_words), :len(enc_words)].astype(np.float64), 0.0, None)
    if renormalize:
        totals = rows.sum(axis=1, keepdims=True)
        rows = np.where(totals > 0, rows / np.where(totals > 0, totals, 1.0),
                        1.0 / len(enc_words))
    n_dec, n_enc = max(dec_words) + 1, max(enc_words) + 1
    by_enc_word = np.zeros((len(dec_words), n_enc))
    np.add.at(by_enc_word.T, np.asarray(enc_words), rows.T)       # sum within encoder words
    matrix = np.zeros((n_dec, n_enc))
    if pooling == "max":   # rows are >= 0, so the zeros take the first subword's row
        np.maximum.at(matrix, np.asarray(dec_words), by_enc_word)
    else:                  # the mean over subwords
        np.add.at(matrix, np.asarray(dec_words), by_enc_word)
        matrix /= np.bincount(np.asarray(dec_words), minlength=n_dec)[:, None]
    return (matrix.T if direction == "fwd" else matrix).astype(np.float32)


def no_alignment(pair: EncodedPair) -> np.ndarray:
    """The soft matrix of a pair that gets no alignment, float32 and without elements, so that
    a skipped line costs nothing whatever its length: (0, target words) or (source words, 0)
    for an empty side, (0, 0) for a pair too long for the model (a (source words, target words)
    matrix of zeros would take I·J floats: 37 GiB for a line of 100,000 words)."""
    n_src = max(pair.src_word_index, default=-1) + 1
    n_tgt = max(pair.tgt_word_index, default=-1) + 1
    shape = (n_src, n_tgt) if n_src == 0 or n_tgt == 0 else (0, 0)
    return np.zeros(shape, dtype=np.float32)


@torch.no_grad()
def soft_alignments(model: AlignmentModel, pairs: Sequence[EncodedPair], direction: str,
                    method: str, max_tokens: Optional[int] = None,
                    device: Optional[torch.device] = None,
                    options: Optional[Dict[str, Any]] = None,
                    progress: bool = False, pooling: str = "mean") -> List[np.ndarray]:
    """Word-level soft alignment matrices (source words, target words), float32, input order.

    See :func:`word_matrix` for the normalization and `pooling`. Pairs that get no alignment
    get a matrix without elements (:func:`no_alignment`). ``progress``: a tqdm bar on stderr.
    """
    options = options or {}
    model.eval()
    renormalize = not model.leaves_unaligned_mass(method)
    results = [no_alignment(p) for p in pairs]
    for b, (indices, batch) in enumerate(pair_batches(model, pairs, direction, max_tokens,
                                                      device, f"soft {direction}", progress)):
        scores = model.alignment_scores(batch.src, batch.tgt_in, batch.tgt_out, method,
                                        **options).float().cpu().numpy()
        for row, k in enumerate(indices):
            results[k] = word_matrix(scores[row], pairs[k], direction, renormalize, pooling)
        if (b + 1) % RELEASE_BATCHES == 0:   # the heap's free pages back (aligner/malloc.py)
            release_free_memory()
    return results


def _soft_alignments_process(model: AlignmentModel, pairs: Sequence[EncodedPair],
                             direction: str, method: str, max_tokens: Optional[int],
                             options: Optional[Dict[str, Any]], threads: int,
                             progress: bool, autocast: Optional[torch.dtype] = None,
                             pooling: str = "mean") -> List[np.ndarray]:
    """Body of one worker of :func:`soft_alignments_by_direction` (a "spawn" process);
    `autocast`: the caller's CPU autocast dtype (None: none), entered here."""
    torch.set_num_threads(threads)
    with (torch.autocast("cpu", dtype=autocast) if autocast is not None
          else contextlib.nullcontext()):
        return soft_alignments(model, pairs, direction, method, max_tokens,
                               torch.device("cpu"), options, progress, pooling)


def _exit_on_sigterm() -> None:
    """In a worker process: SIGTERM (the parent's terminate() after an error, Ctrl-C or
    SIGTERM of its own) ends the process by SystemExit, so that multiprocessing's clean-up
    runs: a process killed on the spot leaves its semaphores (tqdm's lock) to the resource
    tracker, which warns about them at the parent's exit. Once the process is on its way out
    (its pool told it to stop), SIGTERM is ignored: an exception raised in its exit handlers
    would only print noise."""
    import signal
    import sys
    from multiprocessing.util import Finalize

    def stop(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit(1)

    signal.signal(signal.SIGTERM, stop)
    # the first of multiprocessing's exit handlers of this process
    Finalize(None, signal.signal, (signal.SIGTERM, signal.SIG_IGN), exitpriority=1000)


def _direction_worker_start() -> None:
    """Initializer of a :class:`DirectionWorkers` process: the allocator settings of the
    parent (aligner/malloc.py) and :func:`_exit_on_sigterm`."""
    keep_freed_memory()
    _exit_on_sigterm()


class DirectionWorkers:
    """The two "spawn" worker processes of :func:`soft_alignments_by_direction` (one per
    direction), started at first use and kept for every later call inside the ``with`` block:
    `align extract` / `align run` start one pair for all the blocks of a corpus instead of a
    pair per block. A SIGTERM inside the block stops the workers (utils.sigterm_raises)."""

    def __init__(self) -> None:
        self._pool: Any = None
        self._signals = contextlib.ExitStack()

    def __enter__(self) -> "DirectionWorkers":
        self._signals.enter_context(sigterm_raises())  # `kill` of this process stops them too
        return self

    def pool(self) -> Any:
        """The multiprocessing Pool of the two workers (started by the first call)."""
        if self._pool is None:
            # a spawned worker starts with the C library's defaults (aligner/malloc.py)
            self._pool = multiprocessing.get_context("spawn").Pool(
                len(C.DIRECTIONS), initializer=_direction_worker_start)
        return self._pool

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        try:
            if self._pool is not None:
                if exc_type is not None:
                    self._pool.terminate()
                # close + join: the workers exit on their own (terminate leaks semaphores)
                self._pool.close()
                self._pool.join()
        finally:
            self._signals.close()


def soft_alignments_by_direction(models: Dict[str, AlignmentModel],
                                 pairs: Sequence[EncodedPair], directions: Sequence[str],
                                 method: str, max_tokens: Optional[int] = None,
                                 device: Optional[torch.device] = None,
                                 options: Optional[Dict[str, Any]] = None,
                                 progress: bool = False,
                                 parallel: Union[bool, DirectionWorkers] = False,
                                 pooling: str = "mean") -> Dict[str, List[np.ndarray]]:
    """:func:`soft_alignments` of every direction in `directions`: {direction: matrices}
    (`pooling`: :func:`word_matrix`'s).

    ``parallel`` (the command line asks for it): on a CPU with two or more cores, both
    directions and at least :data:`PARALLEL_MIN_PAIRS` pairs, each direction runs in its own
    "spawn" process with half of this process's torch threads, as ``--parallel-directions``
    trains them (small batched ops scale better over processes than over threads): in the
    workers of a :class:`DirectionWorkers` given as `parallel`, else in two started for this
    call. The model and the pairs are sent to the workers and the matrices come back in input
    order; values equal the in-process ones to float rounding. Under CPU autocast
    (``--precision bf16``) each worker enters the same bfloat16 autocast itself (a "spawn"
    process inherits no autocast state). Off in the Python API by default, where a "spawn"
    process would re-run a script that has no ``if __name__ == "__main__"`` guard.
    """
    device = device or model_device(models[directions[0]])
    if (parallel and device.type == "cpu" and len(directions) == 2
            and (os.cpu_count() or 1) >= 2 and len(pairs) >= PARALLEL_MIN_PAIRS):
        autocast = active_autocast_dtype("cpu")
        with contextlib.ExitStack() as stack:
            workers = (parallel if isinstance(parallel, DirectionWorkers)
                       else stack.enter_context(DirectionWorkers()))
            threads = max(1, torch.get_num_threads() // 2)
            results = workers.pool().starmap(_soft_alignments_process, [
                (models[d], pairs, d, method, max_tokens, options, threads, progress, autocast,
                 pooling) for d in directions])
        return dict(zip(directions, results))
    return {d: soft_alignments(models[d], pairs, d, method, max_tokens, device, options,
                               progress, pooling) for d in directions}


def loaded_max_positions(loaded: LoadedModelDir) -> Optional[int]:
    """The longest sequence every loaded direction accepts (None: no limit)."""
    return min([m for m in map(model_max_positions, loaded.models.values()) if m is not None],
               default=None)


def default_options(model: AlignmentModel, method: str, options: Dict[str, Any]
                    ) -> Dict[str, Any]:
    """`options` with the extraction defaults of `method` filled in (a copy): the lexicon
    ``shortlist`` of the recipe (aligner/training/recipe.py SHORTLIST) for the methods that
    take one (the model's ``SHORTLIST_METHODS``; ``shortlist=0`` given: exact). What `align
    extract` and ``Aligner.align`` align with."""
    from aligner.training import recipe

    options = dict(options)
    if method in model.SHORTLIST_METHODS:
        options.setdefault("shortlist", recipe.SHORTLIST)
    return options


def usable(pair: EncodedPair, max_positions: Optional[int]) -> bool:
    """A pair can be aligned: both sides non-empty and (with a limit) short enough."""
    if len(pair.src_ids) == 0 or len(pair.tgt_ids) == 0:
        return False
    return max_positions is None or pair.width <= max_positions


def _unusable_reason(pair: EncodedPair, limit: Optional[int], bitext: Bitext
                     ) -> Tuple[str, str]:
    """(file name, reason) for a pair that :func:`usable` refuses, naming the faulty side."""
    sides = ((bitext.source_name, len(pair.src_ids)), (bitext.target_name, len(pair.tgt_ids)))
    empty = [name for name, length in sides if length == 0]
    if empty:
        return empty[0], "an empty side"
    long = [name for name, length in sides if limit is not None and length + 1 > limit]
    name = " and ".join(dict.fromkeys(long)) or bitext.source_name
    return name, f"{pair.width} positions > the model's limit of {limit}"


def encode_bitext(loaded: LoadedModelDir, bitext: Bitext, tokenize: bool = True
                  ) -> List[EncodedPair]:
    """Tokenize (when the model was trained with --tokenize), BPE and encode every line.

    Warns (naming the line) about lines that will get an empty alignment: an empty side, or a
    pair longer than the model accepts.
    """
    pre = loaded.preprocessor
    pairs = []
    limit = loaded_max_positions(loaded)
    n_warned = 0
    for line_no, (src_words, tgt_words) in enumerate(zip(bitext.source, bitext.target),
                                                      bitext.first_line):
        if tokenize and (pre.config.tokenize or pre.config.lowercase):
            src_words = pre.tokenize_line(" ".join(src_words), "src")
            tgt_words = pre.tokenize_line(" ".join(tgt_words), "tgt")
        pair = encode_pair(pre, loaded.src_vocab, loaded.tgt_vocab, src_words, tgt_words)
        if not usable(pair, limit):
            n_warned += 1
            if n_warned <= MAX_WARNINGS:
                name, reason = _unusable_reason(pair, limit, bitext)
                logger.warning("%s:%d: %s: writing an empty alignment", name, line_no, reason)
        pairs.append(pair)
    if n_warned > MAX_WARNINGS:
        logger.warning("%d lines in all get an empty alignment (only the first %d are listed)",
                       n_warned, MAX_WARNINGS)
    return pairs


def extract_all(loaded: Union[LoadedModelDir, str], bitext: Bitext, method: str,
                directions: Sequence[str] = C.DIRECTIONS,
                heuristics: Sequence[str] = (C.DEFAULT_HEURISTIC,),
                max_tokens: Optional[int] = None, device: Optional[torch.device] = None,
                options: Optional[Dict[str, Any]] = None,
                threshold: float = DEFAULT_THRESHOLD,
                progress: bool = False, parallel: Union[bool, "DirectionWorkers"] = False
                ) -> Dict[str, List[Set[Link]]]:
    """Alignments of every line of `bitext` per direction and per symmetrization heuristic.

    Returns ``{"fwd": [...], "rev": [...], "grow-diag": [...], ...}`` (directions requested,
    heuristics only when both directions are), each a list with one source–target link set
    per input line, in input order. `loaded` may be a model directory path (loaded on `device`,
    best checkpoint, only the directions asked for). The heuristics combine the two
    directions through aligner.links.combine: a Moses heuristic their hard links; ``soft-average``
    averages their word-level soft alignments (:func:`soft_alignments`, computed once for
    all, only when a heuristic needs them) and keeps the links above `threshold`. ``progress``:
    tqdm bars on stderr, one per direction and pass.
    ``parallel``: the soft matrices of the two directions in two processes on a multi-core
    CPU (:func:`soft_alignments_by_direction`).
    """
    if isinstance(loaded, str):
        loaded = LoadedModelDir.load(loaded, directions, "best", device)
    pairs = encode_bitext(loaded, bitext)
    out: Dict[str, List[Set[Link]]] = {}
    for direction in directions:
        out[direction] = align_pairs(loaded.models[direction], pairs, direction, method,
                                     max_tokens, device, options, progress)
    if "fwd" in out and "rev" in out:
        soft: Optional[Dict[str, List[np.ndarray]]] = None
        if any(needs_soft(heuristic) for heuristic in heuristics):   # one pass for all
            soft = soft_alignments_by_direction(loaded.models, pairs, C.DIRECTIONS, method,
                                                max_tokens, device, options, progress,
                                                parallel)
        for heuristic in heuristics:
            out[heuristic] = combine(heuristic, threshold, hard=out, soft=soft)
    return out


def extract(loaded: Union[LoadedModelDir, str], bitext: Bitext, method: str,
            direction: str = "both",
            heuristic: str = C.DEFAULT_HEURISTIC, max_tokens: Optional[int] = None,
            device: Optional[torch.device] = None,
            options: Optional[Dict[str, Any]] = None,
            threshold: float = DEFAULT_THRESHOLD, progress: bool = False,
            parallel: Union[bool, "DirectionWorkers"] = False) -> List[Set[Link]]:
    """Word-level source–target links per input line: one direction, or both symmetrized
    (`heuristic`: a Moses heuristic or soft-average with `threshold`; `parallel`: see
    extract_all).

    `loaded`: a :class:`LoadedModelDir` or a model directory path.
    """
    if direction == "both" and needs_soft(heuristic):   # needs no hard links
        if isinstance(loaded, str):
            loaded = LoadedModelDir.load(loaded, C.DIRECTIONS, "best", device)
        pairs = encode_bitext(loaded, bitext)
        soft = soft_alignments_by_direction(loaded.models, pairs, C.DIRECTIONS, method,
                                            max_tokens, device, options, progress, parallel)
        return combine(heuristic, threshold, soft=soft)
    if direction == "both":
        return extract_all(loaded, bitext, method, C.DIRECTIONS, (heuristic,), max_tokens,
                           device, options, threshold, progress, parallel)[heuristic]
    return extract_all(loaded, bitext, method, (direction,), (), max_tokens, device,
                       options, progress=progress)[direction]
