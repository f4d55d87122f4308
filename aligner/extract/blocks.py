"""Aligning a whole bitext block by block: the block is the unit of work, of resume and of
torch.distributed's shards.

:func:`align_in_blocks` cuts a bitext into blocks of ``block_lines`` lines and has a caller's
function align each one. With a *parts folder* (``align run``: MODEL_DIR/alignment.parts;
``align extract -o FILE``: FILE.parts; a self-training guide: MODEL_DIR/rounds/N/links.align
.parts) every finished block's output lines go, atomically, to part files there::

    PARTS/
      parts.json          what the parts belong to (the record: the model's weights, the
                          input's content, method, heuristic, threshold, block size, ...)
      block000003.NAME    block 3's lines of output NAME
      block000003.json    block 3's counts (and the links of gold lines), written last: the
                          block is finished once it exists
      .lock               the run lock of the process that writes the folder (flock, as a
                          model directory's): a second run on the same output is refused

A run cut off (SIGKILL included) goes on with the first unfinished block when asked to
resume with the same record (another record is refused, one line, rather than mixing two
runs' lines); then the outputs are concatenated in input order, written atomically, and the
folder is removed. The output is the uninterrupted run's, byte for byte.

Under torch.distributed (a process group initialized, e.g. by ``torchrun ... align
extract``) block i is aligned by rank i % world_size; each rank writes its part files, and
after a barrier rank 0 concatenates them into the outputs (the other ranks write nothing
else). Without a parts folder (output to stdout from one process; --soft) the blocks'
lines are written to the outputs as they come, as before.

One progress bar (rank 0, stderr) counts the input lines over the whole corpus, with rate
and ETA.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from aligner import constants as C
from aligner import faults
from aligner.utils import AlignerError, atomic_output, check_condition, remove_stale_temporaries

logger = logging.getLogger(__name__)

#: PARTS/parts.json: the record of what the folder's parts belong to
PARTS_RECORD = "parts.json"
#: the first key of parts.json, which marks a parts folder of ours
_MARK = "aligner_parts"
_FORMAT = 1

#: what a block's function returns: (its lines per output name, each ending in a newline;
#: its meta, a JSON-serializable dict stored with the parts and returned at the end)
BlockResult = Tuple[Dict[str, List[str]], Dict[str, Any]]


def parts_folder(output: Optional[str]) -> Optional[str]:
    """FILE.parts beside output FILE; None for stdout ('-', None) or a device / FIFO."""
    from aligner.utils import is_special_file

    if output is None or output == "-" or is_special_file(output):
        return None
    return output + C.PARTS_SUFFIX


def process_group() -> Tuple[int, int, bool]:
    """(rank, world size, whether a torch.distributed process group is initialized)."""
    try:
        import torch.distributed as dist
    except ImportError:   # pragma: no cover
        return 0, 1, False
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), True
    return 0, 1, False


def bitext_identity(bitext) -> Dict[str, Any]:
    """What identifies the lines of `bitext` for a parts record: the sha256 and size of its
    files (a :class:`aligner.formats.BitextFiles`), the lines a sample keeps of its bitext
    (:class:`aligner.training.samples.SampledBitext`), or the sha256 of the words of an
    in-memory :class:`aligner.formats.Bitext`; and the number of lines."""
    from aligner.model_dir import file_sha256

    if hasattr(bitext, "firsts") and hasattr(bitext, "bitext"):  # runs of joined lines
        digest = hashlib.sha256(bitext.firsts.tobytes()).hexdigest()
        return {"runs": digest, "of": bitext_identity(bitext.bitext), "lines": len(bitext)}
    if hasattr(bitext, "lines") and hasattr(bitext, "bitext"):   # a sample of a bitext
        digest = hashlib.sha256(bitext.lines.tobytes()).hexdigest()
        return {"sample": digest, "of": bitext_identity(bitext.bitext), "lines": len(bitext)}
    if hasattr(bitext, "joint") and hasattr(bitext, "check"):    # BitextFiles
        names = [bitext.joint] if bitext.joint is not None else [bitext.source_name,
                                                                   bitext.target_name]
        return {"files": [{"size": os.path.getsize(name), "sha256": file_sha256(name)}
                          for name in names], "lines": len(bitext)}
    digest = hashlib.sha256()
    for source, target in bitext:
        digest.update((" ".join(source) + "\t" + " ".join(target) + "\n").encode("utf-8"))
    return {"sha256": digest.hexdigest(), "lines": len(bitext)}


def _normalized(record: Dict[str, Any]) -> Dict[str, Any]:
    return json.loads(json.dumps(record, sort_keys=True))


def _block_name(index: int, name: str) -> str:
    return f"block{index:06d}.{name}"


def _meta_path(folder: str, index: int) -> str:
    return os.path.join(folder, _block_name(index, "json"))


def _read_record(folder: str) -> Optional[Dict[str, Any]]:
    """The record of a parts folder of ours; None when `folder` is not one."""
    path = os.path.join(folder, PARTS_RECORD)
    if os.path.islink(folder) or os.path.islink(path) or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            saved = json.load(handle)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(saved, dict) or saved.get(_MARK) != _FORMAT:
        return None
    record = saved.get("record")
    return record if isinstance(record, dict) else None


#: who holds the lock of a parts folder that another run is writing
_HOLDER = "another align process"


def _prepare(folder: str, record: Dict[str, Any], resume: bool, overwrite: bool,
             stale: str, anew: str):
    """Make `folder` ready for the blocks of `record` (see :func:`align_in_blocks`) and take
    its lock (aligner.model_dir.acquire_lock; returned, held until the outputs are written):
    a folder another run is writing is refused (one line naming it), never removed."""
    from aligner.model_dir import acquire_lock, release_lock

    record = _normalized(record)
    if not os.path.lexists(folder):
        if resume:
            logger.debug("%s: no finished blocks to resume from: aligning from the first "
                         "line", folder)
        try:
            os.makedirs(folder)
        except FileExistsError:   # made by another run between our look and now
            raise AlignerError(f"{folder}: {_HOLDER} is writing this directory") from None
        lock = acquire_lock(folder, _HOLDER)
    else:
        check_condition(_read_record(folder) is not None and os.path.isdir(folder),
                        f"{folder}: exists and is not a parts folder of align (no "
                        f"{PARTS_RECORD} of ours); nothing was removed: remove it or write "
                        f"the output elsewhere")
        lock = acquire_lock(folder, _HOLDER)
        try:
            saved = _read_record(folder)   # again under the lock: a holder may have changed it
            check_condition(saved is not None, f"{folder}: its {PARTS_RECORD} went away while "
                                               f"it was opened: run again")
            if resume and saved == record:
                remove_stale_temporaries(folder)
                return lock
            if resume and stale != "discard":
                differences = sorted(key for key in set(saved) | set(record)
                                     if saved.get(key) != record.get(key))
                raise AlignerError(f"{folder}: cannot resume, its finished blocks were aligned "
                                   f"with another {', '.join(differences)} ({anew})")
            if not resume and not overwrite:
                raise AlignerError(f"{folder}: holds the finished blocks of an alignment that "
                                   f"was cut off; continue it with --resume, or start anew "
                                   f"with --overwrite")
            logger.info("%s: removed the blocks of an earlier alignment (%s)", folder,
                        "other model or settings" if resume else "--overwrite")
            _remove(folder, keep=os.path.basename(lock.path))
        except BaseException:   # refused: the folder stays as it was, .lock included
            if lock.handle is not None:
                lock.handle.close()
            raise
    try:
        with atomic_output(os.path.join(folder, PARTS_RECORD)) as out:
            json.dump({_MARK: _FORMAT, "record": record}, out, indent=1, sort_keys=True)
            out.write("\n")
    except BaseException:
        release_lock(lock)
        raise
    return lock


def _finished(folder: str, index: int, names: Sequence[str]) -> Optional[Dict[str, Any]]:
    """The meta of block `index` when it is finished (its meta and every part are there)."""
    if not all(os.path.isfile(os.path.join(folder, _block_name(index, name)))
               for name in names):
        return None
    try:
        with open(_meta_path(folder, index), encoding="utf-8") as handle:
            meta = json.load(handle)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return meta if isinstance(meta, dict) else None


def _broadcast_error(message: Optional[str], distributed: bool) -> None:
    """Rank 0's error (or None) reaches every rank, which raises it: a refusal on rank 0 must
    not leave the others waiting in a barrier. Also a barrier."""
    if distributed:
        import torch.distributed as dist

        box = [message]
        dist.broadcast_object_list(box, src=0)
        message = box[0]
    if message is not None:
        raise AlignerError(message)


def _barrier(distributed: bool) -> None:
    if distributed:
        import torch.distributed as dist

        dist.barrier()


def _progress(total: int, initial: int, description: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=description, unit="pair",
                disable=not enabled, dynamic_ncols=True, smoothing=0.1)


def align_in_blocks(bitext, block_lines: int, outputs: Dict[str, Optional[str]],
                    align_block: Callable[[Any], BlockResult], folder: Optional[str],
                    record: Dict[str, Any], resume: bool = False, overwrite: bool = False,
                    progress: bool = True, description: str = "align", stale: str = "refuse",
                    anew: str = "give the same ones, or --overwrite to start anew",
                    map_blocks: Optional[Callable[[Iterator[Tuple[int, Any]]],
                                                  Iterator[Tuple[int, BlockResult]]]] = None
                    ) -> Optional[List[Dict[str, Any]]]:
    """Align `bitext` block by block (``block_lines`` lines) with `align_block` and write
    each output of `outputs` ({name: file, '-' = stdout; None: not written}) in input order.

    `folder`: the parts folder (None: no parts, one process only; the lines go to the
    outputs as they come). `record`: what the parts belong to, kept in the folder. Without
    `resume` an existing parts folder of ours is refused (one line) unless `overwrite`
    (removed, then the alignment starts anew); with `resume` its finished blocks are kept when
    its record equals `record`, else refused (`anew` says what to do) or, with ``stale
    ="discard"``, removed. A folder that is not ours is never removed, nor one that another
    run is writing (its lock is held: refused, one line).

    Under torch.distributed each rank aligns the blocks i with i % world_size == rank; rank
    0 writes the outputs. Returns every block's meta in input order (on rank 0; None on the
    other ranks, which write nothing but their parts). `map_blocks`: aligns the (index,
    block) pairs to do, giving (index, its result) in their order, instead of `align_block`
    one after the other in this process (aligner.extract.corpus_alignment.BlockProcesses; with a
    parts folder only).
    """
    rank, world, distributed = process_group()
    if not distributed and int(os.environ.get("WORLD_SIZE", "1")) > 1 \
            and int(os.environ.get("RANK", "0")) != 0:
        # torchrun without a process group: every rank runs the same command; rank 0 writes
        return None
    check_condition(folder is not None or not distributed,
                    "under torchrun the ranks write their blocks beside the output: give an "
                    "output file (-o FILE), not stdout")
    n_lines = len(bitext)
    names = [name for name, path in outputs.items() if path is not None]
    if folder is None:
        return _stream(bitext, block_lines, outputs, align_block, n_lines, progress,
                       description)
    error = lock = None
    if rank == 0:
        try:
            lock = _prepare(folder, dict(record, block_lines=block_lines,
                                         outputs=sorted(names)),
                            resume, overwrite, stale, anew)
        except AlignerError as refused:
            error = str(refused)
    _broadcast_error(error, distributed)
    try:
        return _align_blocks(bitext, block_lines, outputs, align_block, folder, names, rank,
                             world, distributed, progress, description, map_blocks)
    finally:
        if lock is not None:
            from aligner.model_dir import release_lock

            release_lock(lock)


def _align_blocks(bitext, block_lines: int, outputs: Dict[str, Optional[str]],
                  align_block: Callable[[Any], BlockResult], folder: str, names: List[str],
                  rank: int, world: int, distributed: bool, progress: bool, description: str,
                  map_blocks=None) -> Optional[List[Dict[str, Any]]]:
    """The blocks of :func:`align_in_blocks` in a prepared parts folder: this rank's
    unfinished ones aligned into their parts, then (rank 0) the outputs written."""
    from aligner.formats import bitext_blocks

    n_lines = len(bitext)
    n_blocks = -(-n_lines // block_lines)
    sizes = [min(block_lines, n_lines - k * block_lines) for k in range(n_blocks)]
    done = {k for k in range(n_blocks) if _finished(folder, k, names) is not None}
    if done and rank == 0:
        logger.info("%s: %d of %d blocks are finished: going on with the others", folder,
                    len(done), n_blocks)
    with _progress(n_lines, sum(sizes[k] for k in done), description,
                   progress and rank == 0) as bar:
        todo = ((index, block) for index, block in enumerate(
            bitext_blocks(bitext, block_lines, bitext.source_name, bitext.target_name))
            if index % world == rank and index not in done)
        results = (map_blocks(todo) if map_blocks is not None
                   else ((index, align_block(block)) for index, block in todo))
        for index, (lines, meta) in results:
            for name in names:
                with atomic_output(os.path.join(folder, _block_name(index, name))) as out:
                    out.writelines(lines[name])
            with atomic_output(_meta_path(folder, index)) as out:
                json.dump(dict(meta, lines=sizes[index]), out)
            del lines
            faults.reached("alignment-block")
            if world == 1:
                bar.update(sizes[index])
            else:   # the lines of every rank's finished blocks
                bar.update(sum(sizes[k] for k in range(n_blocks)
                               if os.path.isfile(_meta_path(folder, k))) - bar.n)
        _barrier(distributed)
        bar.update(n_lines - bar.n)
    metas: Optional[List[Dict[str, Any]]] = None
    error = None
    if rank == 0:
        try:
            metas = _concatenate(folder, n_blocks, outputs, names)
        except AlignerError as failed:
            error = str(failed)
    _broadcast_error(error, distributed)
    return metas


def _concatenate(folder: str, n_blocks: int, outputs: Dict[str, Optional[str]],
                 names: Sequence[str]) -> List[Dict[str, Any]]:
    """Rank 0: every block's parts, in input order, into the outputs (each atomic), then the
    folder is removed; returns the blocks' metas."""
    metas = []
    for index in range(n_blocks):
        meta = _finished(folder, index, names)
        check_condition(meta is not None, f"{folder}: block {index} is missing (a rank did not "
                                          f"write it)")
        metas.append(meta)
    with contextlib.ExitStack() as stack:
        files = {name: stack.enter_context(atomic_output(outputs[name])) for name in names}
        for name, handle in files.items():
            for index in range(n_blocks):
                with open(os.path.join(folder, _block_name(index, name)),
                          encoding="utf-8") as part:
                    shutil.copyfileobj(part, handle)
    _remove(folder)
    return metas


def _remove(folder: str, keep: Optional[str] = None) -> None:
    """Remove a parts folder of ours, its record last: a removal cut off leaves a folder still
    known as ours (with fewer blocks, aligned again on --resume). `keep`: a file name to leave
    (the lock of the run that empties the folder to write it anew), and the folder with it."""
    for name in os.listdir(folder):
        if name not in (PARTS_RECORD, keep):
            path = os.path.join(folder, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(folder, PARTS_RECORD))
    if keep is None:
        os.rmdir(folder)


def _stream(bitext, block_lines: int, outputs: Dict[str, Optional[str]],
            align_block: Callable[[Any], BlockResult], n_lines: int, progress: bool,
            description: str) -> List[Dict[str, Any]]:
    """No parts folder: each block's lines go to the outputs as they come."""
    from aligner.formats import bitext_blocks

    metas = []
    with contextlib.ExitStack() as stack:
        files = {name: stack.enter_context(atomic_output(path))
                 for name, path in outputs.items() if path is not None}
        bar = stack.enter_context(_progress(n_lines, 0, description, progress))
        for block in bitext_blocks(bitext, block_lines, bitext.source_name,
                                   bitext.target_name):
            lines, meta = align_block(block)
            for name, handle in files.items():
                handle.writelines(lines[name])
            metas.append(dict(meta, lines=len(block)))
            bar.update(len(block))
            del block, lines
            faults.reached("alignment-block")
    return metas
