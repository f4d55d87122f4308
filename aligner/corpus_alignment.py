"""Align a whole bitext with a trained model directory, block by block, into Pharaoh files.

What `align run` writes as its output and what a self-training round (aligner/training/rounds.py)
writes as the next round's guide: every input line gets exactly one output line, in input order
(a line with an empty side, or too long for the model, an empty one; in a guide, also a line
the next round's training skips). The bitext is read in blocks of inference.BLOCK_LINES lines,
each aligned and its lines written (to a parts folder that a cut-off run resumes from,
aligner/blocks.py) before the next is read, so memory does not grow with the corpus (but with
``keep_soft``); under torch.distributed the ranks share the blocks out.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

import numpy as np

from aligner import constants as C
from aligner.data import EncodedPair, filtered_out

if TYPE_CHECKING:  # pragma: no cover
    from aligner.config import DataConfig


#: what a line that training skips is aligned as: no subwords, so no links
_EMPTY_PAIR = EncodedPair(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), [], [])


def align_bitext(model_dir: str, bitext, device, method: str, shortlist: int, heuristic: str,
                 threshold: float, outputs: Dict[str, Optional[str]],
                 gold_lines: range = range(0), keep_soft: bool = False, quiet: bool = False,
                 precision: str = "fp32", parts: Optional[str] = None, resume: bool = False,
                 overwrite: bool = False, stale: str = "refuse",
                 block_lines: Optional[int] = None, description: str = "align",
                 trained_by: Optional["DataConfig"] = None
                 ) -> Tuple[Dict[str, List[Set[Tuple[int, int]]]], Optional[Dict[str, Any]], int]:
    """Align every line of `bitext` (a Bitext, BitextFiles or SampledBitext) with the model
    in `model_dir`: extraction `method` in both directions, combined by `heuristic` (a soft
    one at `threshold`), block by block (`block_lines`, default inference.BLOCK_LINES; one
    block with `keep_soft`), writing each block's lines to `outputs` ({"fwd" / "rev" /
    heuristic: Pharaoh file, '-' = stdout, or None}). `shortlist`: the lexicon's shortlist
    size (0 = exact); `device`: a torch.device; `precision`: of the extraction
    (aligner/precision.py; ``auto``: bf16 on CUDA with native bfloat16, else fp32).

    `parts`: the parts folder that keeps each finished block (aligner/blocks.py; not with
    `keep_soft`), with `resume` / `overwrite` / `stale` as there: a run cut off goes on from
    its first unfinished block. Under torch.distributed the blocks are shared out over the
    ranks (every rank calls this) and rank 0 writes the outputs. One progress bar
    (`description`) over the corpus unless `quiet`. `trained_by`: the length filters of the
    training that reads the output (a self-training round's guide): a line that training skips
    (:func:`aligner.data.filtered_out`) is written empty instead of aligned.

    Returns (the links of `gold_lines` per direction and for the heuristic; with `keep_soft`
    the soft matrices named as in the --soft .npz plus "alignments", the heuristic's links of
    every line, for :func:`aligner.cli.extract.write_results` — the heuristic's output is then
    left to it; the number of links the heuristic wrote). On ranks other than 0: no links,
    None, 0.
    """
    from aligner import inference
    from aligner.blocks import align_in_blocks, bitext_identity
    from aligner.combine import combine, needs_soft
    from aligner.formats import format_links
    from aligner.model_dir import LoadedModelDir, model_checksums
    from aligner.precision import autocast_context, resolve_precision

    loaded = LoadedModelDir.load(model_dir, device=device)
    options = {"shortlist": shortlist} if shortlist else {}
    gold_rows: Dict[str, List[Set[Tuple[int, int]]]] = {"fwd": [], "rev": [], heuristic: []}
    kept: Dict[str, Any] = {"alignments": []} if keep_soft else {}
    paths = {name: path for name, path in outputs.items()
             if path is not None and not (keep_soft and name == heuristic)}
    size = max(1, len(bitext)) if keep_soft else (block_lines or inference.BLOCK_LINES)
    hard_all = bool({"fwd", "rev"} & paths.keys()) or not needs_soft(heuristic)

    def align_block(block) -> Tuple[Dict[str, List[str]], Dict[str, Any]]:
        first = block.first_line - 1                 # 0-based input line of the block's 0
        pairs = inference.encode_bitext(loaded, block)
        if trained_by is not None:
            pairs = [pair if filtered_out(len(pair.src_ids), len(pair.tgt_ids),
                                          trained_by.max_len, trained_by.max_ratio) is None
                     else _EMPTY_PAIR for pair in pairs]
        gold_here = [k - first for k in gold_lines if first <= k < first + len(pairs)]
        hard_lines = range(len(pairs)) if hard_all else gold_here
        hard: Dict[str, List[Set[Tuple[int, int]]]] = {}
        for direction in C.DIRECTIONS:
            links = inference.align_pairs(
                loaded.models[direction], [pairs[k] for k in hard_lines], direction,
                method, device=device, options=options) if len(hard_lines) else []
            hard[direction] = [set() for _ in pairs]
            for k, line_links in zip(hard_lines, links):
                hard[direction][k] = line_links
        soft: Dict[str, List[Any]] = {}
        if needs_soft(heuristic) or keep_soft:   # one pass, used twice
            soft = inference.soft_alignments_by_direction(
                loaded.models, pairs, C.DIRECTIONS, method, device=device,
                options=options, parallel=workers)
            if keep_soft:
                kept.update({f"{d}_{first + k}": m for d in C.DIRECTIONS
                             for k, m in enumerate(soft[d])})
        hard[heuristic] = combine(heuristic, threshold, hard=hard, soft=soft)
        if keep_soft:
            kept["alignments"].extend(hard[heuristic])
        lines = {name: [format_links(links) + "\n" for links in hard[name]]
                 for name in paths}
        gold = {name: [sorted(hard[name][k]) for k in gold_here] for name in gold_rows}
        return lines, {"links": sum(map(len, hard[heuristic])), "gold": gold}

    record = {"model": model_checksums(model_dir, C.DIRECTIONS), "input":
              bitext_identity(bitext), "method": method, "shortlist": shortlist,
              "heuristic": heuristic, "threshold": threshold,
              "precision": resolve_precision(precision, device),
              "gold lines": [gold_lines.start, gold_lines.stop]}
    if trained_by is not None:
        record["skipped as training skips"] = [trained_by.max_len, trained_by.max_ratio]
    with contextlib.ExitStack() as stack:
        stack.enter_context(autocast_context(precision, device))
        workers = stack.enter_context(inference.DirectionWorkers())   # one pair for all blocks
        metas = align_in_blocks(bitext, size, paths, align_block,
                                None if keep_soft else parts, record, resume, overwrite,
                                progress=not quiet, description=description, stale=stale,
                                anew=f"remove {parts} to align anew")
    if metas is None:
        return gold_rows, None, 0
    for meta in metas:
        for name in gold_rows:
            gold_rows[name].extend({(int(i), int(j)) for i, j in links}
                                   for links in meta["gold"][name])
    return gold_rows, (kept if keep_soft else None), sum(meta["links"] for meta in metas)
