"""The one extraction path of a whole bitext: every command that aligns a corpus with a model
directory aligns it here.

* `align extract` (a file, block by block; a pipe, batch by batch, aligner/extract/streaming.py;
  torchrun, the blocks shared out over the ranks; --soft, one block holding every matrix),
* `align run`'s final alignment (its outputs -o, -f, -r, the links of the gold lines),
* a self-training round's guide (aligner/training/rounds.py) and the alignment layer's stage 0
  (aligner/training/recipe_guide.py)

all describe what they align with as one :class:`Extraction` (the loaded model directory and
the method's settings, resolved) and turn each block of lines into its output lines with
:func:`lines_of_block`; :func:`align_bitext` does that block by block through
aligner/extract/blocks.py. Every input line gets exactly one output line, in input order (a line
with an empty side, or too long for the model, an empty one; in a guide, also a line the next
round's training skips). The bitext is read in blocks of inference.BLOCK_LINES lines, each
aligned and its lines written (to a parts folder that a cut-off run resumes from) before the
next is read, so memory does not grow with the corpus (but with ``keep_soft``).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Deque, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from aligner import constants as C
from aligner.data import EncodedPair, filtered_out
from aligner.links.soft_symmetrize import threshold_record
from aligner.malloc import release_free_memory
from aligner.utils import AlignerError, check_condition

if TYPE_CHECKING:  # pragma: no cover
    from aligner.config import DataConfig
    from aligner.extract.mixture import Mixture
    from aligner.model_dir import LoadedModelDir

logger = logging.getLogger(__name__)

Link = Tuple[int, int]
#: the output of :func:`align_bitext` that holds each main link's probability (the lines of
#: ``align extract --link-probs``)
PROBS = "probs"

#: what a line that training skips is aligned as: no subwords, so no links
_EMPTY_PAIR = EncodedPair(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), [], [])


@dataclass
class Extraction:
    """What a model directory aligns sentence pairs with, resolved.

    loaded: the model directory (aligner.model_dir.LoadedModelDir) with the directions used.
    method: the extraction method (the model kind's METHODS). direction: ``fwd``, ``rev`` or
    ``both`` (symmetrized by `heuristic`: a Moses heuristic, or soft-average at
    `threshold`). device: a torch.device. options: the method's options (-O KEY=VALUE,
    ``shortlist``). max_tokens: positions per inference batch (None: the device's).
    mixture: another model directory whose soft matrices are mixed into these
    (aligner/extract/mixture.py; ``align extract --mix``), or None. pooling: how a word's
    row combines its subwords' in the soft matrices (aligner.extract.inference.word_matrix;
    ``align extract --subword-pooling``).
    """

    loaded: "LoadedModelDir"
    method: str
    direction: str
    heuristic: str
    threshold: Any   # a float, or aligner.links.calibration.LengthThresholds
    device: Any
    options: Dict[str, Any] = field(default_factory=dict)
    max_tokens: Optional[int] = None
    mixture: Optional["Mixture"] = None
    pooling: str = "mean"

    @classmethod
    def load(cls, model_dir: str, device: Any, method: str, heuristic: str, threshold: float,
             options: Optional[Dict[str, Any]] = None, direction: str = "both",
             checkpoint: str = "best", max_tokens: Optional[int] = None,
             mix_dir: Optional[str] = None, mix_weight: Optional[float] = None,
             mix_length: Optional[int] = None,
             mix_threshold: Optional[float] = None, pooling: str = "mean") -> "Extraction":
        """The model directory's `checkpoint` weights of the directions used, on `device`,
        and the mixture of `mix_dir` / `mix_weight` / `mix_length` / `mix_threshold`
        (:func:`aligner.extract.mixture.resolve_mixture`: by default the teacher the
        directory records)."""
        from aligner.extract.mixture import resolve_mixture
        from aligner.model_dir import LoadedModelDir

        directions = C.DIRECTIONS if direction == "both" else (direction,)
        loaded = LoadedModelDir.load(model_dir, directions, checkpoint, device)
        mixture = resolve_mixture(loaded, mix_dir, mix_weight, direction, heuristic, device,
                                  mix_length, mix_threshold)
        return cls(loaded, method, direction, heuristic, threshold, device, options or {},
                   max_tokens, mixture, pooling)

    @property
    def directions(self) -> Tuple[str, ...]:
        """The directions whose models align: both, or the one asked for."""
        return C.DIRECTIONS if self.direction == "both" else (self.direction,)

    @property
    def main(self) -> str:
        """The name of the main output: the heuristic (both directions) or the direction."""
        return self.heuristic if self.direction == "both" else self.direction


def shortlist_options(shortlist: int) -> Dict[str, Any]:
    """The method options of the lexicon's `shortlist` (0: exact, no option)."""
    return {"shortlist": shortlist} if shortlist else {}


def lines_of_block(extraction: Extraction, pairs: Sequence[EncodedPair], names: Sequence[str],
                inline: bool = False, gold_here: Sequence[int] = (), keep_soft: bool = False,
                workers: Any = False, mix_pairs: Optional[Sequence[EncodedPair]] = None
                ) -> Tuple[Dict[str, List[str]], Dict[str, List[Set[Link]]],
                           Dict[str, List[np.ndarray]]]:
    """Align the encoded `pairs` of one block (or one streamed batch) and format its lines.

    names: the outputs wanted: ``fwd``, ``rev`` (each direction's own links; direction
    ``both`` only), ``extraction.main`` and :data:`PROBS` (the main links' probabilities,
    aligner.extract.link_probs); `inline`: the main output's links as ``i-j:p``. gold_here: lines
    (indices into `pairs`) whose links of ``fwd``, ``rev`` and the main output are wanted too.
    keep_soft: the soft matrices are computed (and returned) even where no output needs them.
    workers: the DirectionWorkers of the caller (or True / False), for the soft matrices.
    mix_pairs: the same lines encoded for ``extraction.mixture`` (:func:`encode_block`), whose
    soft matrices are then mixed into the extraction's own.

    Returns (lines per name in `names`, each ending in a newline; the links per name, with
    every line of an output asked for and the gold lines of the others, the rest empty; the
    soft matrices per direction, empty when none were computed). What is computed: each
    direction's hard links (aligner.extract.inference.align_pairs) where an output or the heuristic
    needs them, the soft matrices (soft_alignments_by_direction) where soft-average, the
    probabilities or `keep_soft` need them, the main links from those.
    """
    from aligner.extract import inference
    from aligner.extract.link_probs import output_lines
    from aligner.formats import format_links
    from aligner.links.combine import combine, needs_soft

    main, both = extraction.main, extraction.direction == "both"
    # the probabilities of the main links, where an output takes them
    scored = PROBS in names or (inline and main in names)
    soft_main = both and needs_soft(extraction.heuristic)
    everything = range(len(pairs))
    # the hard links of each direction: of every line where an output takes them (its own
    # output, the main output of one direction, a Moses heuristic), else of the gold lines
    hard_everywhere = {d for d in extraction.directions
                       if d in names or not both or not soft_main}
    hard: Dict[str, List[Set[Link]]] = {}
    for direction in extraction.directions:
        lines = everything if direction in hard_everywhere else gold_here
        links = inference.align_pairs(
            extraction.loaded.models[direction], [pairs[k] for k in lines], direction,
            extraction.method, extraction.max_tokens, extraction.device,
            extraction.options) if len(lines) else []
        hard[direction] = [set() for _ in pairs]
        for k, line_links in zip(lines, links):
            hard[direction][k] = line_links
    soft: Dict[str, List[np.ndarray]] = {}
    threshold = extraction.threshold
    if soft_main or scored or keep_soft:   # one pass, used for all
        soft = inference.soft_alignments_by_direction(
            extraction.loaded.models, pairs, extraction.directions, extraction.method,
            extraction.max_tokens, extraction.device, extraction.options, parallel=workers,
            pooling=extraction.pooling)
        if extraction.mixture is not None:
            from aligner.extract.mixture import mix

            check_condition(mix_pairs is not None and len(mix_pairs) == len(pairs),
                            "a mixture needs its model's encoding of every line")
            other = extraction.mixture.soft(mix_pairs, extraction.max_tokens,
                                            extraction.device, workers, extraction.pooling)
            # each line's threshold: each model's share at its own
            threshold = extraction.mixture.thresholds(extraction.threshold, soft["fwd"],
                                                      other["fwd"])
            soft = mix(soft, other, extraction.mixture.weight, extraction.mixture.long_line)
    if both:
        hard[main] = combine(extraction.heuristic, threshold, hard=hard, soft=soft)
    lines_by_name: Dict[str, List[str]] = {}
    if scored:
        lines_by_name[main], numbers = output_lines(hard[main], soft, extraction.direction,
                                                    extraction.heuristic, inline)
        lines_by_name[PROBS] = numbers or []
    for name in names:
        if name not in lines_by_name:
            lines_by_name[name] = [format_links(links) + "\n" for links in hard[name]]
    return {name: lines_by_name[name] for name in names}, hard, soft


def encode_block(extraction: Extraction, block, trained_by: Optional["DataConfig"] = None
                 ) -> List[EncodedPair]:
    """The encoded pairs of a block (aligner.extract.inference.encode_bitext: its warnings about
    lines that get an empty alignment); `trained_by`: a line that training with these length filters
    skips (:func:`aligner.data.filtered_out`) is aligned as an empty pair."""
    from aligner.extract import inference

    pairs = inference.encode_bitext(extraction.loaded, block)
    if trained_by is None:
        return pairs
    return [pair if filtered_out(len(pair.src_ids), len(pair.tgt_ids), trained_by.max_len,
                                 trained_by.max_ratio) is None else _EMPTY_PAIR
            for pair in pairs]


def encode_mix_block(extraction: Extraction, block, pairs: Sequence[EncodedPair]
                     ) -> Optional[List[EncodedPair]]:
    """The lines of `block` encoded for ``extraction.mixture`` (None without one); a line
    that :func:`encode_block` made an empty pair (`pairs`: its result) is one here too."""
    if extraction.mixture is None:
        return None
    return [_EMPTY_PAIR if mine is _EMPTY_PAIR else theirs
            for mine, theirs in zip(pairs, extraction.mixture.encode(block))]


def gold_names(extraction: Extraction) -> List[str]:
    """The outputs whose links of the gold lines :func:`align_bitext` returns: fwd and rev
    (both directions) and the main one."""
    return [name for name in ("fwd", "rev", extraction.main)
            if name == extraction.main or extraction.direction == "both"]


@dataclass
class BlockJob:
    """What every block of one :func:`align_bitext` is aligned with, besides the extraction:
    the output names of :func:`lines_of_block`, `inline`, the 0-based input lines whose
    links are wanted (`gold_lines`) and the training filters `trained_by`
    (:func:`encode_block`)."""

    names: List[str]
    inline: bool
    gold_lines: range
    trained_by: Optional["DataConfig"]

    def align(self, extraction: Extraction, block, keep_soft: bool = False,
              workers: Any = False) -> Tuple[Dict[str, List[str]], Dict[str, Any], Any]:
        """One block: (its lines per output name, its meta: the main output's number of links
        and the gold lines' links, (its main links, its soft matrices by direction))."""
        first = block.first_line - 1                 # 0-based input line of the block's 0
        pairs = encode_block(extraction, block, self.trained_by)
        gold_here = [k - first for k in self.gold_lines if first <= k < first + len(pairs)]
        lines, hard, soft = lines_of_block(extraction, pairs, self.names, self.inline,
                                           gold_here, keep_soft, workers,
                                           encode_mix_block(extraction, block, pairs))
        gold = {name: [sorted(hard[name][k]) for k in gold_here]
                for name in gold_names(extraction)}
        meta = {"links": sum(map(len, hard[extraction.main])), "gold": gold}
        return lines, meta, (hard[extraction.main], soft)


def cpu_cores() -> int:
    """The cores this process may run on (its CPU affinity, else os.cpu_count())."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # pragma: no cover (not Linux)
        return os.cpu_count() or 1


#: what one block process holds at its peak besides its teacher's tables, with a margin: about
#: 0.9 GB measured on 10,000-line blocks of the 25k and 407k en-fr models, 0.6 GB since ideep's
#: cache is capped (eval/results/block_processes.md, extract_memory.md)
BLOCK_PROCESS_BYTES = 1 << 30


def available_memory() -> Optional[int]:
    """The bytes this process can still take: the kernel's MemAvailable, or less where the
    process's cgroup (a container's memory limit: v2 memory.max, v1 memory.limit_in_bytes)
    leaves less; None where neither is known (not Linux)."""
    known = []
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    known.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit, encoding="ascii") as file:
                value = file.read().strip()
            with open(usage, encoding="ascii") as file:
                used = int(file.read().strip())
        except (OSError, ValueError):
            continue
        if value.isdigit() and int(value) < 1 << 60:   # "max" / a huge number: no limit
            known.append(max(0, int(value) - used))
    return min(known) if known else None


def block_process_bytes(extraction: "Extraction") -> int:
    """The memory one block process of `extraction` is expected to hold at its peak:
    :data:`BLOCK_PROCESS_BYTES`, and twice the weight files its mixture loads (the teacher's
    lexicon tables and their hash index) where it has one."""
    from aligner.model_dir import params_path

    if extraction.mixture is None:
        return BLOCK_PROCESS_BYTES
    weights = (params_path(extraction.mixture.path, direction) for direction in C.DIRECTIONS)
    return BLOCK_PROCESS_BYTES + 2 * sum(os.path.getsize(path) for path in weights
                                         if os.path.isfile(path))


def block_processes(asked: int, device: Any, n_blocks: int, process_bytes: int = 0) -> int:
    """How many processes align the blocks of one bitext: `asked` (--processes; 0 = every
    core this process has threads for: min(cores, torch threads), and no more than the
    available memory holds at `process_bytes` each: :func:`available_memory`), at most one
    per block; 1 (this process, with a pair of direction workers) on a GPU, under
    torch.distributed (the ranks share the blocks out already) and for one block."""
    from aligner.extract.blocks import process_group

    import torch

    if device.type != "cpu" or process_group()[2] or n_blocks < 2:
        return 1
    if asked:
        return max(1, min(asked, n_blocks))
    # by default no more processes than this process's threads (--threads 4 on 64 cores: 4)
    cores = max(1, min(cpu_cores(), torch.get_num_threads(), n_blocks))
    memory = available_memory() if process_bytes > 0 else None
    if memory is None or memory >= cores * process_bytes:
        return cores
    fitting = max(1, memory // process_bytes)
    logger.info("%d processes instead of one per core (%d): %.1f GB of memory available, "
                "about %.1f GB each (--processes N to choose)", fitting, cores, memory / 1e9,
                process_bytes / 1e9)
    return fitting


#: the extraction and job of a block process (:class:`BlockProcesses`), set at its start
_BLOCK_WORKER: Dict[str, Any] = {}


def _block_worker_start(model_dir: str, checkpoint: str, settings: Dict[str, Any],
                        mixture: Any, job: BlockJob, threads: int, autocast: Any,
                        quiet: bool) -> None:
    """Initializer of a block process: the parent's allocator settings, the console logging,
    `threads` torch threads, the model directory loaded on the CPU (the same weights as the
    parent's: its checksums are in the parts record) with the parent's `mixture` (its
    aligner.extract.mixture.Mixture, its models not loaded, or None) as it is, so that its weight,
    long-line length and thresholds are the parent's, then SIGTERM ends the process
    (:func:`_end_block_worker`). A SIGTERM while the model loads ends the process on the spot,
    as it holds nothing then: raised as SystemExit inside this initializer, concurrent.futures
    would print its traceback."""
    import torch

    from aligner.log import setup_logging
    from aligner.malloc import keep_freed_memory

    keep_freed_memory()
    setup_logging(quiet=quiet)
    torch.set_num_threads(threads)
    extraction = Extraction.load(model_dir, torch.device("cpu"), checkpoint=checkpoint,
                                 mix_weight=0.0, **settings)
    if mixture is not None:
        extraction.mixture = dataclasses.replace(mixture, device=torch.device("cpu"))
    _BLOCK_WORKER.update(extraction=extraction, job=job, autocast=autocast)
    signal.signal(signal.SIGTERM, _end_block_worker)


def _end_block_worker(signum: int, frame: Any) -> None:
    """SIGTERM in a block process (its pool stopping it): end the process now, running
    multiprocessing's exit clean-up first (so that its semaphores are released, not left to the
    resource tracker to warn about). Not by SystemExit, as the direction workers end
    (aligner.extract.inference._exit_on_sigterm): raised inside a block, concurrent.futures
    would take it for the block's error and the process would go on to the next block."""
    from multiprocessing import util

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        util._exit_function()   # what a process runs when its target returns
    finally:
        os._exit(1)


def _align_block_in_worker(block) -> Tuple[Dict[str, List[str]], Dict[str, Any]]:
    """Body of a block process: one block's lines and meta (:meth:`BlockJob.align`)."""
    import torch

    autocast = _BLOCK_WORKER["autocast"]
    with (torch.autocast("cpu", dtype=autocast) if autocast is not None
          else contextlib.nullcontext()):
        lines, meta, _ = _BLOCK_WORKER["job"].align(_BLOCK_WORKER["extraction"], block)
    return lines, meta


class BlockProcesses:
    """`processes` "spawn" processes that align whole blocks, each with its share of this
    process's torch threads (at least 1): every core of a CPU at work on a corpus of several
    blocks, where the two direction workers of one block at a time stop at two
    (:func:`block_processes`). :meth:`map` keeps at most two blocks per process in flight, so
    memory does not grow with the corpus, and gives the results in input order; a block
    gives the same lines as in this process with as many threads.

    A process that dies (the OOM killer) or cannot start (a model that does not load) ends
    the alignment with one error instead of a wait for its block (concurrent.futures raises
    BrokenProcessPool, where multiprocessing.Pool would start another and wait forever). A
    SIGTERM inside the block stops the processes (utils.sigterm_raises), as an error does."""

    def __init__(self, extraction: Extraction, job: BlockJob, processes: int,
                 checkpoint: str, quiet: bool) -> None:
        import concurrent.futures
        import multiprocessing

        import torch

        from aligner.precision import active_autocast_dtype
        from aligner.utils import sigterm_raises

        settings = dict(method=extraction.method, heuristic=extraction.heuristic,
                        threshold=extraction.threshold, options=extraction.options,
                        direction=extraction.direction, max_tokens=extraction.max_tokens,
                        pooling=extraction.pooling)
        # the mixture's settings, without the models it may have loaded here
        mixture = (None if extraction.mixture is None
                   else dataclasses.replace(extraction.mixture, _loaded=None))
        self.processes = processes
        threads = max(1, torch.get_num_threads() // processes)
        self._signals = contextlib.ExitStack()
        self._signals.enter_context(sigterm_raises())   # `kill` of this process stops them too
        self._executor = concurrent.futures.ProcessPoolExecutor(
            processes, mp_context=multiprocessing.get_context("spawn"),
            initializer=_block_worker_start,
            initargs=(extraction.loaded.path, checkpoint, settings, mixture, job, threads,
                      active_autocast_dtype("cpu"), quiet))

    def map(self, blocks):
        """(index, (lines, meta)) of every (index, block) of `blocks`, in their order."""
        from concurrent.futures.process import BrokenProcessPool

        pending: Deque[Tuple[int, Any]] = collections.deque()

        def broken(index: int) -> AlignerError:
            return AlignerError(f"a block process ended before its block {index} was aligned "
                                f"(out of memory? try --processes 1 or fewer --threads)")

        def oldest() -> Tuple[int, Any]:
            index, future = pending.popleft()
            try:
                return index, future.result()
            except BrokenProcessPool:
                raise broken(index) from None

        for index, block in blocks:
            try:   # a pool found broken already refuses the next block
                future = self._executor.submit(_align_block_in_worker, block)
            except BrokenProcessPool:
                raise broken(pending[0][0] if pending else index) from None
            pending.append((index, future))
            if len(pending) >= 2 * self.processes:
                yield oldest()
        while pending:
            yield oldest()

    def __enter__(self) -> "BlockProcesses":
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        try:
            if exc_type is not None:   # stop the blocks in flight instead of waiting for them
                stop_processes(list((getattr(self._executor, "_processes", None)
                                     or {}).values()))
            self._executor.shutdown(wait=True, cancel_futures=exc_type is not None)
        finally:
            self._signals.close()


#: seconds a stopped block process has to end on SIGTERM before it is killed
STOP_GRACE_S = 10.0


def stop_processes(workers: Sequence[Any], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to each multiprocessing Process of `workers`, then SIGKILL to those still
    running after `grace_s` seconds. A block process ends on SIGTERM (:func:`_end_block_worker`);
    this is for one that cannot (stuck in a long native call, its handler never run), which the
    executor's shutdown would otherwise wait for forever. Waits on the processes' sentinels, so
    no process is reaped here (the executor's own join does that)."""
    from multiprocessing.connection import wait
    import time

    for process in workers:
        process.terminate()   # a no-op for one already ended
    deadline = time.monotonic() + grace_s
    running = list(workers)
    while running and time.monotonic() < deadline:
        ended = set(wait([process.sentinel for process in running],
                         timeout=max(0.0, deadline - time.monotonic())))
        running = [process for process in running if process.sentinel not in ended]
    for process in running:
        process.kill()


def align_bitext(extraction: Extraction, bitext, outputs: Dict[str, Optional[str]],
                 inline_probs: bool = False, gold_lines: range = range(0),
                 keep_soft: bool = False, quiet: bool = False, precision: str = "fp32",
                 parts: Optional[str] = None, resume: bool = False, overwrite: bool = False,
                 stale: str = "refuse", block_lines: Optional[int] = None,
                 description: str = "align", trained_by: Optional["DataConfig"] = None,
                 checkpoint: str = "best",
                 anew: str = "give the same ones, or --overwrite to start anew",
                 processes: int = 0
                 ) -> Tuple[Dict[str, List[Set[Link]]], Optional[Dict[str, Any]], int]:
    """Align every line of `bitext` (a Bitext, BitextFiles or SampledBitext) with
    `extraction`, block by block (`block_lines`, default inference.BLOCK_LINES; one block
    with `keep_soft`), writing each block's lines to `outputs` ({"fwd" / "rev" /
    extraction.main / :data:`PROBS`: a file, '-' = stdout, or None}; see
    :func:`lines_of_block`, `inline_probs` its `inline`). `precision`: of the extraction
    (aligner/precision.py; ``auto``: bf16 on CUDA with native bfloat16, else fp32);
    `checkpoint`: the weights the extraction loaded (for the parts record); `anew`: what a
    refused --resume tells the user to do (aligner/extract/blocks.py). `processes`: how many
    processes align the blocks on a CPU (0 = every core; :func:`block_processes`), each
    block's lines the same whatever the number.

    `parts`: the parts folder that keeps each finished block (aligner/extract/blocks.py; not with
    `keep_soft`), with `resume` / `overwrite` / `stale` as there: a run cut off goes on from
    its first unfinished block. Under torch.distributed the blocks are shared out over the
    ranks (every rank calls this) and rank 0 writes the outputs. One progress bar
    (`description`) over the corpus unless `quiet`. `trained_by`: see :func:`encode_block`.

    Returns (the links of `gold_lines` of "fwd", "rev" and the main output, those the
    extraction has; with `keep_soft` the soft matrices named as in the --soft .npz
    ("{direction}_{line}", 0-based) plus "alignments", the main output's links of every line,
    for :func:`aligner.cli.extract.write_results` — the main output and its probabilities are
    then left to it; the number of links of the main output). On ranks other than 0: no
    links, None, 0.
    """
    from aligner.extract import inference
    from aligner.extract.blocks import align_in_blocks, bitext_identity
    from aligner.model_dir import model_checksums
    from aligner.precision import autocast_context, resolve_precision

    main, device = extraction.main, extraction.device
    gold_rows: Dict[str, List[Set[Link]]] = {name: [] for name in gold_names(extraction)}
    kept: Dict[str, Any] = {"alignments": []} if keep_soft else {}
    paths = {name: path for name, path in outputs.items()
             if path is not None and not (keep_soft and name in (main, PROBS))}
    size = max(1, len(bitext)) if keep_soft else (block_lines or inference.BLOCK_LINES)

    job = BlockJob(list(paths), inline_probs, gold_lines, trained_by)

    def align_block(block) -> Tuple[Dict[str, List[str]], Dict[str, Any]]:
        lines, meta, (links, soft) = job.align(extraction, block, keep_soft, workers)
        if keep_soft:
            first = block.first_line - 1
            kept.update({f"{d}_{first + k}": m for d, matrices in soft.items()
                         for k, m in enumerate(matrices)})
            kept["alignments"].extend(links)
        return lines, meta

    record = {"model": model_checksums(extraction.loaded.path, extraction.directions,
                                       checkpoint),
              "input": bitext_identity(bitext), "method": extraction.method,
              "options": extraction.options, "direction": extraction.direction,
              "heuristic": extraction.heuristic,
              "threshold": threshold_record(extraction.threshold),
              "precision": resolve_precision(precision, device),
              "inline_probs": inline_probs,
              "max_tokens": extraction.max_tokens or inference.default_max_tokens(
                  device, extraction.loaded.models[extraction.directions[0]]),
              "gold lines": [gold_lines.start, gold_lines.stop],
              **inference.pooling_entry(extraction.pooling)}
    if extraction.mixture is not None:
        record["mix"] = extraction.mixture.identity()
    if trained_by is not None:
        record["skipped as training skips"] = [trained_by.max_len, trained_by.max_ratio]
    # (without a parts folder the lines go out as they come, one block after the other)
    n_blocks = 1 if keep_soft or parts is None else -(-len(bitext) // size)
    processes = block_processes(processes, device, n_blocks, block_process_bytes(extraction))
    with contextlib.ExitStack() as stack:
        stack.enter_context(autocast_context(precision, device))
        if processes > 1:   # whole blocks in processes of their own, every core at work
            # what this process freed (the training of `align run`) goes back to the kernel
            release_free_memory()
            logger.info("%s: %d blocks of %d lines in %d processes", description, n_blocks,
                        size, processes)
            workers, pool = False, stack.enter_context(
                BlockProcesses(extraction, job, processes, checkpoint, quiet))
        else:   # one block at a time, its two directions in a pair of worker processes
            workers, pool = stack.enter_context(inference.DirectionWorkers()), None
        metas = align_in_blocks(bitext, size, paths, align_block,
                                None if keep_soft else parts, record, resume, overwrite,
                                progress=not quiet, description=description, stale=stale,
                                anew=anew, map_blocks=pool.map if pool is not None else None)
    if metas is None:
        return gold_rows, None, 0
    for meta in metas:
        for name in gold_rows:
            gold_rows[name].extend({(int(i), int(j)) for i, j in links}
                                   for links in meta["gold"][name])
    return gold_rows, (kept if keep_soft else None), sum(meta["links"] for meta in metas)
