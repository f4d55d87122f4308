"""EM training of the classical aligner (aligner/models/classical.py): IBM Model 1, then the
first-order HMMs of both directions in agreement, streamed over the corpus in blocks.

Memory: each EM iteration reads the corpus block by block (from the memory-mapped encoded
corpus of the model directory, or any iterable of blocks), computes a block's posteriors of
both directions, adds its counts and drops them: what stays is the lexicon (its keys, counts
and probabilities: the word pairs seen together in a line) and the jumps, not the corpus nor
any posterior past its block. Each cell's position in the lexicon is looked up once, in the
first pass, and kept in a file per block (a model directory's training) or with the batches
(the teacher's lines, in memory anyway).

Processes: under torchrun (a process group initialized), rank r takes blocks r, r + N, ...
of each iteration and the counts are summed over the ranks (``torch.distributed.all_reduce``)
before each M-step, so N processes train the tables one process would (within float
tolerance: the sums are added in another order). Every rank builds the same lexicon keys from
the whole corpus (one pass), so the tables line up without communication.

Conventions: the direction "fwd" observes the target words given the source words (states);
"rev" the source given the target. In a batch, ``src`` (B, J) and ``tgt`` (B, I) are word ids
padded with -1; fwd's posteriors are (B, I, J) [target i, source j], rev's (B, J, I).
"""
from __future__ import annotations

import logging
import os
import time
from typing import (TYPE_CHECKING, Callable, Dict, Iterable, Iterator, List, Optional,
                    Sequence, Tuple)

import numpy as np
import torch

from aligner.models.classical import ClassicalConfig, Lexicon, forward_backward

if TYPE_CHECKING:  # pragma: no cover
    from aligner.config import RunConfig
    from aligner.training.loop import TrainSummary

logger = logging.getLogger(__name__)

#: one line: its source and target word ids (any integer arrays)
Line = Tuple[np.ndarray, np.ndarray]
#: the corpus as a callable that gives its blocks anew for every pass
Blocks = Callable[[], Iterable[Sequence[Line]]]


class _Batch:
    """Lines of one block, padded: src (B, J) / tgt (B, I) int64 ids (-1 = padding), their
    masks, and each direction's lexicon keys (computed when first asked for): fwd (B, I, J)
    given = source, empty column key in fwd_empty (B, I); rev (B, J, I), rev_empty (B, J).
    rows: the lines' positions in their block."""

    def __init__(self, lines: Sequence[Line], rows: Sequence[int], n_src: int, n_tgt: int):
        self.rows = list(rows)
        self.n_src, self.n_tgt = n_src, n_tgt
        longest_src = max(len(lines[r][0]) for r in rows)
        longest_tgt = max(len(lines[r][1]) for r in rows)
        src = np.full((len(rows), longest_src), -1, dtype=np.int64)
        tgt = np.full((len(rows), longest_tgt), -1, dtype=np.int64)
        for b, r in enumerate(rows):
            src[b, :len(lines[r][0])] = lines[r][0]
            tgt[b, :len(lines[r][1])] = lines[r][1]
        self.src, self.tgt = torch.from_numpy(src), torch.from_numpy(tgt)
        self._set_masks(self.src >= 0, self.tgt >= 0)
        self._keys: Optional[Dict[str, torch.Tensor]] = None

    @classmethod
    def of_lengths(cls, src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> "_Batch":
        """A batch known by its lines' lengths only (masks, no words): one whose lexicon
        positions are kept (:func:`train_tables`' later passes)."""
        batch = cls.__new__(cls)
        batch.rows, batch.src, batch.tgt, batch._keys = [], None, None, None
        src, tgt = torch.from_numpy(src_lengths), torch.from_numpy(tgt_lengths)
        batch._set_masks(torch.arange(int(src.max()))[None, :] < src[:, None],
                         torch.arange(int(tgt.max()))[None, :] < tgt[:, None])
        return batch

    def _set_masks(self, src_mask: torch.Tensor, tgt_mask: torch.Tensor) -> None:
        self.src_mask, self.tgt_mask = src_mask, tgt_mask
        # real positions: fwd observes the target (rows) given the source (columns)
        self.masks = {"fwd": (tgt_mask, src_mask), "rev": (src_mask, tgt_mask)}
        # positions in the lexicon of the real cells (:meth:`cells`, row-major), when kept
        self.kept: Dict[str, torch.Tensor] = {}

    def _make_keys(self) -> None:
        s, t = self.src.clamp_min(0), self.tgt.clamp_min(0)
        n_src, n_tgt = self.n_src, self.n_tgt
        self._keys = {"fwd": s[:, None, :] * n_tgt + t[:, :, None],
                      "rev": t[:, None, :] * n_src + s[:, :, None]}
        self._empty_keys = {"fwd": n_src * n_tgt + t, "rev": n_tgt * n_src + s}

    @property
    def keys(self) -> Dict[str, torch.Tensor]:
        if self._keys is None:
            self._make_keys()
        return self._keys

    @property
    def empty_keys(self) -> Dict[str, torch.Tensor]:
        if self._keys is None:
            self._make_keys()
        return self._empty_keys

    def forget_keys(self, direction: str) -> None:
        """Drop `direction`'s keys (once its lexicon positions are kept)."""
        if self._keys is not None:
            self._keys.pop(direction, None)
            self._empty_keys.pop(direction, None)

    def cells(self, direction: str) -> torch.Tensor:
        """(B, I, J + 1) bool: the real cells of `direction` (an observed word of a line by one
        of its given words, or by the empty word in the last column)."""
        observed, given = self.masks[direction]
        return observed[:, :, None] & torch.cat(
            [given, given.new_ones(given.shape[0], 1)], -1)[:, None, :]

    def positions(self, direction: str, padding: int) -> torch.Tensor:
        """(B, I, J + 1) int64 lexicon positions of `direction`'s cells from the kept ones of
        its real cells, `padding` (the table's padding entry) where a cell is not real."""
        real = self.cells(direction)
        full = torch.full(real.shape, padding, dtype=torch.long)
        # masked_scatter_: 4-5x the speed of indexing with the mask (full[real] = ...)
        return full.masked_scatter_(real, self.kept[direction].long())


def batches_of(block: Sequence[Line], n_src: int, n_tgt: int, batch_cells: int,
               max_words: int) -> Iterator[_Batch]:
    """The lines of `block` with both sides non-empty and at most `max_words` words, sorted by
    length and cut into batches of at most `batch_cells` source × target words × lines."""
    rows = [r for r, (s, t) in enumerate(block)
            if 0 < len(s) <= max_words and 0 < len(t) <= max_words]
    rows.sort(key=lambda r: (len(block[r][0]), len(block[r][1])))
    start = 0
    while start < len(rows):
        stop, longest_s, longest_t = start, 0, 0
        while stop < len(rows):
            s = max(longest_s, len(block[rows[stop]][0]))
            t = max(longest_t, len(block[rows[stop]][1]))
            if stop > start and (stop - start + 1) * s * t > batch_cells:
                break
            longest_s, longest_t, stop = s, t, stop + 1
        yield _Batch(block, rows[start:stop], n_src, n_tgt)
        start = stop


class _Table:
    """One direction's lexicon during training: sorted keys (N,), probabilities (N + 1,)
    float64 with a last entry for padding, and the given word of every key."""

    def __init__(self, keys: np.ndarray, n_given: int, n_observed: int):
        self.keys = torch.from_numpy(keys)
        self.n_given, self.n_observed = n_given, n_observed
        self.probs = torch.ones(len(keys) + 1, dtype=torch.float64)   # uniform start
        self.probs[-1] = 0.0

    def index(self, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Positions of `keys` in the table (every real one is there); N where `mask` is
        False (or, which never happens for a cell of the corpus, the key is not there).

        A batch's distinct keys, sorted, are looked up by binary search: neighbouring
        queries read neighbouring table entries, so the search stays in cache (a block of
        6.2M cells with 38 % distinct: 1.8x a hash table's time, eval/results/classical_enfr.md,
        and no index of 4-8 bytes per key)."""
        position = torch.full(keys.shape, len(self.keys), dtype=torch.long)
        if len(self.keys) == 0:
            return position
        distinct, inverse = torch.unique(keys[mask], return_inverse=True)  # sorted
        found = torch.searchsorted(self.keys, distinct)
        there = self.keys.index_select(0, found.clamp_max(len(self.keys) - 1)) == distinct
        position[mask] = torch.where(there, found, len(self.keys))[inverse]
        return position

    def gather(self, positions: torch.Tensor) -> torch.Tensor:
        """The probabilities at `positions` (any shape), float64 (index_select: 4x the speed
        of indexing with a tensor on the CPU)."""
        return self.probs.index_select(0, positions.reshape(-1)).view(positions.shape)

    def normalize(self, counts: torch.Tensor) -> None:
        """t(o | g) = c(g, o) / c(g) from counts (N + 1,) (the last: padding, dropped)."""
        counts = counts[:-1]
        given = self.keys // self.n_observed               # n_given: the empty word
        totals = torch.zeros(self.n_given + 1, dtype=torch.float64).index_add_(0, given, counts)
        torch.div(counts, totals.index_select(0, given).clamp_min_(1e-300), out=self.probs[:-1])


class _Reducer:
    """Sums tensors over the ranks of an initialized process group (nothing to do alone)."""

    def __init__(self, across_ranks: bool = True) -> None:
        import torch.distributed as dist

        self.enabled = across_ranks and dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.enabled else 0
        self.world = dist.get_world_size() if self.enabled else 1

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            import torch.distributed as dist

            dist.all_reduce(tensor)
        return tensor


def _unique(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of an int64 array: by sorting (numpy's sort is vectorized;
    its np.unique hashes int64 keys, 100 times slower on millions of them here)."""
    ordered = np.sort(values)
    if len(ordered) == 0:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def _save_block(path: str, lengths: List[np.ndarray], positions: Dict[str, List[np.ndarray]]
                ) -> None:
    """One block's kept batches in one int32 file (no zip, no checksum: a scratch file of
    this run): [number of batches, each batch's line count, the (2, B) source and target
    lengths of each, fwd's positions, rev's positions], the positions of real cells only
    (:meth:`_Batch.cells`, in their row-major order: no padding, about half the bytes of
    whole (B, I, J + 1) batches on the Hansards)."""
    parts = [np.array([len(lengths)], dtype=np.int32),
             np.array([part.shape[1] for part in lengths], dtype=np.int32)]
    parts += [part.ravel() for part in lengths]
    parts += [np.concatenate(positions[d]) if positions[d] else np.zeros(0, dtype=np.int32)
              for d in ("fwd", "rev")]
    np.save(path, np.concatenate(parts))


def _saved_batches(path: str) -> Iterator[_Batch]:
    """The batches :func:`_save_block` wrote, with their real cells' positions kept (int32,
    views of the file's array)."""
    stored = np.load(path)
    count = int(stored[0])
    sizes = stored[1:1 + count]
    offset = 1 + count
    batches = []
    for size in sizes.tolist():
        lengths = stored[offset:offset + 2 * size].reshape(2, size)
        batches.append(_Batch.of_lengths(lengths[0], lengths[1]))
        offset += 2 * size
    for direction in ("fwd", "rev"):
        for batch in batches:
            count = int(batch.cells(direction).sum())
            batch.kept[direction] = torch.from_numpy(stored[offset:offset + count])
            offset += count
    yield from batches


def lexicon_keys(blocks: Blocks, n_src: int, n_tgt: int, config: ClassicalConfig,
                 max_words: int) -> Dict[str, np.ndarray]:
    """Every (given, observed) key of a real cell of the corpus, per direction, sorted and
    unique (one pass over all blocks: the same on every rank). The word pairs are found once,
    as fwd's keys; rev's are the same pairs the other way round, and each direction's empty
    word has a key for every word it observes."""
    pairs: List[np.ndarray] = []
    words: Dict[str, List[np.ndarray]] = {"src": [], "tgt": []}
    pending = 0   # keys found since the last merge
    for block in blocks():
        for batch in batches_of(block, n_src, n_tgt, config.batch_cells, max_words):
            observed, given = batch.masks["fwd"]
            pairs.append(_unique(batch.keys["fwd"][observed[:, :, None]
                                                     & given[:, None, :]].numpy()))
            words["src"].append(_unique(batch.src[batch.src_mask].numpy()))
            words["tgt"].append(_unique(batch.tgt[batch.tgt_mask].numpy()))
            pending += len(pairs[-1])
        if pending > 20_000_000:   # merge, so the unmerged parts stay bounded
            pairs = [_unique(np.concatenate(pairs))]
            pending = 0
    empty = np.zeros(0, dtype=np.int64)
    fwd = _unique(np.concatenate(pairs)) if pairs else empty
    src = _unique(np.concatenate(words["src"])) if words["src"] else empty
    tgt = _unique(np.concatenate(words["tgt"])) if words["tgt"] else empty
    source, target = fwd // n_tgt, fwd % n_tgt
    rev = np.sort(target * n_src + source)
    # the empty word is given id n_given: its keys come after every real word's
    return {"fwd": np.concatenate([fwd, n_src * n_tgt + tgt]),
            "rev": np.concatenate([rev, n_tgt * n_src + src])}


def train_tables(blocks: Blocks, n_src: int, n_tgt: int, config: ClassicalConfig,
                 max_words: int = 1023,
                 progress: Optional[Callable[[Dict[str, float]], None]] = None,
                 across_ranks: bool = True, keep_batches: bool = False,
                 positions_dir: Optional[str] = None
                 ) -> Dict[str, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """EM of both directions on the corpus `blocks` (a callable giving its blocks of lines,
    called once per pass); word ids of the source below `n_src`, of the target below `n_tgt`.
    Lines with an empty side or a side over `max_words` words are left out.

    Returns per direction (lexicon keys (N,) int64 sorted, probabilities (N,) float32, jump
    weights (2·max_jump + 1,) float32), what :meth:`ClassicalHMM.set_tables` takes: fwd's
    given side is the source (n_given = n_src, n_observed = n_tgt), rev's the target.
    `progress`: called after each iteration with its log-likelihood per direction (of the
    tables before its M-step, summed over the ranks). `across_ranks`: under torchrun, the
    ranks share the blocks and sum their counts (every rank must call); False: this process
    trains alone (the recipe's teacher, on rank 0).

    Each cell's position in the lexicon is looked up once, in the first pass, then kept: with
    `keep_batches` in memory with the batches (for a corpus held in memory anyway, the
    teacher's), with `positions_dir` in one file per block there (int32, read back block by
    block: memory stays bounded, the disk holds 8 bytes per source × target word pair of the
    corpus, its real cells only), else looked up again in every pass."""
    reducer = _Reducer(across_ranks)
    kept: List[_Batch] = []
    cached = keep_batches or positions_dir is not None

    saved_blocks: List[str] = []   # this rank's block files, once the first pass wrote them

    def each_batch() -> Iterator[_Batch]:
        """This rank's batches of the corpus, one pass, with their lexicon positions where
        kept. With `positions_dir`, the first pass reads the lines and looks the positions
        up; it writes each block's positions and its batches' line lengths to a file, from
        which the later passes take the batches without reading a line."""
        if kept:
            yield from kept
            return
        if saved_blocks:
            for path in saved_blocks:
                yield from _saved_batches(path)
            return
        written_blocks = []
        for number, block in enumerate(blocks()):
            if number % reducer.world != reducer.rank:
                continue
            lengths: List[np.ndarray] = []
            written: Dict[str, List[np.ndarray]] = {"fwd": [], "rev": []}
            for batch in batches_of(block, n_src, n_tgt, config.batch_cells, max_words):
                if keep_batches:
                    kept.append(batch)
                yield batch
                if positions_dir is not None:   # looked up in this pass: to the file
                    lengths.append(np.stack([batch.src_mask.sum(1).numpy(),
                                             batch.tgt_mask.sum(1).numpy()]).astype(np.int32))
                    for direction in ("fwd", "rev"):
                        written[direction].append(
                            batch.kept.pop(direction).numpy().astype(np.int32))
            if positions_dir is not None:
                path = os.path.join(positions_dir, f"block{number}.npy")
                _save_block(path, lengths, written)
                written_blocks.append(path)
        saved_blocks.extend(written_blocks)

    def index_of(batch: _Batch, direction: str, table: "_Table") -> torch.Tensor:
        """(B, I, J + 1) positions in `table` of the batch's cells of `direction`, the empty
        word's in the last column (the padding entry where a cell is not real)."""
        if direction in batch.kept:
            return batch.positions(direction, len(table.keys))
        keys = torch.cat([batch.keys[direction], batch.empty_keys[direction][:, :, None]], -1)
        real = batch.cells(direction)
        index = table.index(keys, real)
        if cached:   # the positions stay; the keys, as large, are not needed again
            # the real cells' only (the teacher's Hansards batches are 41 % padding), int32
            # where the table allows: 354 MB instead of 598 MB for the 407k job's teacher
            positions = torch.masked_select(index, real)
            small = len(table.keys) < 2 ** 31
            batch.kept[direction] = positions.int() if small else positions
            batch.forget_keys(direction)
        return index

    started = time.time()
    keys = lexicon_keys(blocks, n_src, n_tgt, config, max_words)
    sizes = {"fwd": (n_src, n_tgt), "rev": (n_tgt, n_src)}          # (given, observed)
    tables = {d: _Table(keys[d], *sizes[d]) for d in keys}
    jumps = {d: torch.ones(2 * config.max_jump + 1, dtype=torch.float64) for d in keys}
    logger.info("classical lexicon: %d fwd and %d rev word pairs (%.1f s)",
                len(keys["fwd"]), len(keys["rev"]), time.time() - started)

    def report(stage: str, likelihood: torch.Tensor) -> None:
        logger.info("classical %s: log-likelihood fwd %.1f, rev %.1f (%.1f s)", stage,
                    float(likelihood[0]), float(likelihood[1]), time.time() - started)
        if progress is not None:
            progress({"fwd": float(likelihood[0]), "rev": float(likelihood[1])})

    for iteration in range(config.ibm1_iterations):
        counts = {d: torch.zeros(len(keys[d]) + 1, dtype=torch.float64) for d in keys}
        likelihood = torch.zeros(2, dtype=torch.float64)
        for batch in each_batch():
            for k, direction in enumerate(("fwd", "rev")):
                observed, _ = batch.masks[direction]
                table = tables[direction]
                index = index_of(batch, direction, table)                # (B, I, J + 1)
                emission = table.gather(index)
                total = emission.sum(-1, keepdim=True)
                counts[direction].scatter_add_(0, index.reshape(-1).long(),
                                               (emission / total.clamp_min(1e-300)).reshape(-1))
                # p(o_i | given line) = Σ_j t(o_i | g_j) / (J + 1), the empty word's included
                choices = batch.masks[direction][1].sum(-1, keepdim=True) + 1       # (B, 1)
                likelihood[k] += (total[..., 0] / choices)[observed].log().sum()
        for direction in keys:
            tables[direction].normalize(reducer.sum_(counts[direction]))
        report(f"IBM-1 iteration {iteration + 1}", reducer.sum_(likelihood))

    for iteration in range(config.hmm_iterations):
        counts = {d: torch.zeros(len(keys[d]) + 1, dtype=torch.float64) for d in keys}
        jump_counts = {d: torch.zeros_like(jumps[d]) for d in keys}
        likelihood = torch.zeros(2, dtype=torch.float64)
        for batch in each_batch():
            posteriors, indices = {}, {}
            for k, direction in enumerate(("fwd", "rev")):
                observed, given = batch.masks[direction]
                table = tables[direction]
                cells = index_of(batch, direction, table)                # (B, I, J + 1)
                posterior, lines_ll, expected = forward_backward(
                    table.gather(cells[:, :, :-1]), table.gather(cells[:, :, -1]), observed,
                    given, jumps[direction], config.empty_prob, config.max_jump, want_jumps=True,
                    boundaries=config.boundaries)
                posteriors[direction] = posterior
                indices[direction] = (cells, observed)
                jump_counts[direction] += expected
                likelihood[k] += lines_ll.sum()
            if config.agreement:   # each direction counts the product, in its layout
                both = posteriors["fwd"] * posteriors["rev"].transpose(1, 2)
                posteriors = {"fwd": both, "rev": both.transpose(1, 2)}
            for direction, (cells, observed) in indices.items():
                posterior = posteriors[direction].double()
                left = (observed.double() - posterior.sum(-1)).clamp_min(0)   # the empty word's
                counts[direction].scatter_add_(
                    0, cells.reshape(-1).long(),
                    torch.cat([posterior, left[:, :, None]], -1).reshape(-1))
        for direction in keys:
            tables[direction].normalize(reducer.sum_(counts[direction]))
            jumps[direction] = reducer.sum_(jump_counts[direction]).clamp_min(1e-6)
        report(f"HMM iteration {iteration + 1}", reducer.sum_(likelihood))
    return {d: (tables[d].keys, tables[d].probs[:-1].float(), jumps[d].float()) for d in keys}


def posteriors(block: Sequence[Line], lexicons: Dict[str, Lexicon],
               jumps: Dict[str, torch.Tensor], config: ClassicalConfig, max_words: int = 1023
               ) -> Dict[str, List[Optional[np.ndarray]]]:
    """Each direction's posteriors of every line of `block`, in the orientation (source words,
    target words): fwd[s, t] = p(source s | target t) (the HMM observing the target), rev[s, t]
    = p(target t | source s); None for a line left out (an empty side, over `max_words`)."""
    result: Dict[str, List[Optional[np.ndarray]]] = {"fwd": [None] * len(block),
                                                     "rev": [None] * len(block)}
    n_src, n_tgt = lexicons["fwd"].n_given, lexicons["fwd"].n_observed
    for batch in batches_of(block, n_src, n_tgt, config.batch_cells, max_words):
        for direction in ("fwd", "rev"):
            observed, given = batch.masks[direction]
            obs_ids, given_ids = ((batch.tgt, batch.src) if direction == "fwd"
                                  else (batch.src, batch.tgt))
            real, empty = lexicons[direction].emissions(given_ids.clamp_min(0),
                                                        obs_ids.clamp_min(0))
            posterior, _, _ = forward_backward(real, empty, observed, given, jumps[direction],
                                               config.empty_prob, config.max_jump,
                                               boundaries=config.boundaries)
            array = posterior.numpy()
            for b, r in enumerate(batch.rows):
                n_s, n_t = len(block[r][0]), len(block[r][1])
                if direction == "fwd":            # (target, source) -> (source, target)
                    result[direction][r] = np.ascontiguousarray(array[b, :n_t, :n_s].T)
                else:
                    result[direction][r] = np.ascontiguousarray(array[b, :n_s, :n_t])
    return result


#: lines per block of a model directory's EM pass (memory: a block's batches at a time)
BLOCK_LINES = 10_000


def train_model_dir(model_dir: str, config: "RunConfig", is_main: bool
                    ) -> Dict[str, "TrainSummary"]:
    """`align train --model classical`: EM on the model directory's encoded corpus (words:
    no BPE), read in blocks of :data:`BLOCK_LINES` lines each iteration, the counts summed
    over the ranks under torchrun; rank 0 (`is_main`) writes each direction's tables as its
    best weights (``DIR/params.best.pt``). Returns a summary per direction."""
    import shutil

    from aligner.data import EncodedCorpus
    from aligner.model_dir import CORPUS_DIR, build_direction_model, params_path, save_params
    from aligner.training.loop import TrainSummary

    corpus = EncodedCorpus.open(os.path.join(model_dir, CORPUS_DIR))
    settings = ClassicalConfig.from_dict(dict(config.models[config.directions[0]]))
    if config.directions[0] == "rev":   # the rev model's given side is the target language
        settings = ClassicalConfig.from_dict({**settings.to_dict(),
                                              "src_vocab_size": settings.tgt_vocab_size,
                                              "tgt_vocab_size": settings.src_vocab_size})

    def blocks() -> Iterator[List[Line]]:
        for start in range(0, len(corpus), BLOCK_LINES):
            yield corpus.lines(start, min(len(corpus), start + BLOCK_LINES))

    started = time.time()
    likelihoods: List[Dict[str, float]] = []
    # each rank's lexicon positions, kept on disk between passes (ours: removed at the end)
    positions = os.path.join(model_dir, CORPUS_DIR, f"positions.{_Reducer().rank}")
    shutil.rmtree(positions, ignore_errors=True)   # of a run killed while it trained
    os.makedirs(positions)
    try:
        tables = train_tables(blocks, settings.src_vocab_size, settings.tgt_vocab_size,
                              settings, max_words=settings.max_positions - 1,
                              progress=likelihoods.append, positions_dir=positions)
    finally:
        shutil.rmtree(positions, ignore_errors=True)
    seconds = time.time() - started
    summaries = {}
    words = {"fwd": int(corpus.tgt_lengths.sum()), "rev": int(corpus.src_lengths.sum())}
    for direction in config.directions:
        if is_main:
            model = build_direction_model(config, direction)
            model.set_tables(*tables[direction])
            os.makedirs(os.path.dirname(params_path(model_dir, direction)), exist_ok=True)
            save_params(model, params_path(model_dir, direction))
        summaries[direction] = TrainSummary(
            updates=0, epochs=settings.ibm1_iterations + settings.hmm_iterations,
            tokens=words[direction], seconds=seconds,
            tokens_per_s=words[direction] / max(seconds, 1e-9),
            last_train_loss=(-likelihoods[-1][direction] / max(1, words[direction])
                             if likelihoods else float("nan")),
            best_score=None, best_update=0, metrics=[])
    return summaries
