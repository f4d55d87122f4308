"""Align a whole bitext with a trained model directory, block by block, into Pharaoh files.

What `align run` writes as its output and what a self-training round (aligner/self_training.py)
writes as the next round's guide: every input line gets exactly one output line, in input order
(a line with an empty side, or too long for the model, an empty one). The bitext is read in
blocks of inference.BLOCK_LINES lines and each block's lines are written before the next is read,
so memory does not grow with the corpus (but with ``keep_soft``).
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional, Set, Tuple

from aligner import constants as C
from aligner import faults


def align_bitext(model_dir: str, bitext, device, method: str, shortlist: int, heuristic: str,
                 threshold: float, outputs: Dict[str, Optional[str]],
                 gold_lines: range = range(0), keep_soft: bool = False, quiet: bool = False,
                 precision: str = "fp32") -> Tuple[Dict[str, List[Set[Tuple[int, int]]]], Optional[Dict[str, Any]], int]:
    """Align every line of `bitext` (a Bitext or BitextFiles) with the model in `model_dir`:
    extraction `method` in both directions, combined by `heuristic` (a soft one at
    `threshold`), block by block (inference.BLOCK_LINES lines; one block with `keep_soft`),
    writing each block's lines to `outputs` ({"fwd" / "rev" / heuristic: Pharaoh file, '-' =
    stdout, or None}). `shortlist`: the lexicon's shortlist size (0 = exact); `device`: a
    torch.device; `precision`: of the extraction (aligner/precision.py; ``auto``: bf16 on
    CUDA with native bfloat16, else fp32).

    Returns (the links of `gold_lines` per direction and for the heuristic; with `keep_soft`
    the soft matrices named as in the --soft .npz plus "alignments", the heuristic's links of
    every line, for :func:`aligner.cli.extract.write_results` — the heuristic's output is then
    left to it; the number of links the heuristic wrote).
    """
    from aligner import inference
    from aligner.formats import bitext_blocks, format_links
    from aligner.model_dir import LoadedModelDir
    from aligner.precision import autocast_context
    from aligner.soft_symmetrize import soft_average
    from aligner.symmetrize import symmetrize
    from aligner.utils import atomic_output

    loaded = LoadedModelDir.load(model_dir, device=device)
    options = {"shortlist": shortlist} if shortlist else {}
    gold_rows: Dict[str, List[Set[Tuple[int, int]]]] = {"fwd": [], "rev": [], heuristic: []}
    kept: Dict[str, Any] = {"alignments": []} if keep_soft else {}
    paths = {name: path for name, path in outputs.items()
             if path is not None and not (keep_soft and name == heuristic)}
    n_links = 0
    size = len(bitext) if keep_soft else inference.BLOCK_LINES
    with contextlib.ExitStack() as stack:
        stack.enter_context(autocast_context(precision, device))
        files = {name: stack.enter_context(atomic_output(path)) for name, path in paths.items()}
        workers = stack.enter_context(inference.DirectionWorkers())   # one pair for all blocks
        for block in bitext_blocks(bitext, size, bitext.source_name, bitext.target_name):
            first = block.first_line - 1                 # 0-based input line of the block's 0
            pairs = inference.encode_bitext(loaded, block)
            gold_here = [k - first for k in gold_lines if first <= k < first + len(pairs)]
            hard_lines = (range(len(pairs)) if ({"fwd", "rev"} & files.keys()
                                                or heuristic in C.HEURISTICS) else gold_here)
            hard: Dict[str, List[Set[Tuple[int, int]]]] = {}
            for direction in C.DIRECTIONS:
                links = inference.align_pairs(
                    loaded.models[direction], [pairs[k] for k in hard_lines], direction,
                    method, device=device, options=options, progress=not quiet) \
                    if len(hard_lines) else []
                hard[direction] = [set() for _ in pairs]
                for k, line_links in zip(hard_lines, links):
                    hard[direction][k] = line_links
            soft: Dict[str, List[Any]] = {}
            if heuristic in C.SOFT_HEURISTICS or keep_soft:   # one pass, used twice
                soft = inference.soft_alignments_by_direction(
                    loaded.models, pairs, C.DIRECTIONS, method, device=device,
                    options=options, progress=not quiet, parallel=workers)
                if keep_soft:
                    kept.update({f"{d}_{first + k}": m for d in C.DIRECTIONS
                                 for k, m in enumerate(soft[d])})
            if heuristic in C.SOFT_HEURISTICS:
                hard[heuristic] = [soft_average(f, r, threshold)
                                   for f, r in zip(soft["fwd"], soft["rev"])]
            else:
                hard[heuristic] = [symmetrize(f, r, heuristic)
                                   for f, r in zip(hard["fwd"], hard["rev"])]
            for name, handle in files.items():
                handle.writelines(format_links(links) + "\n" for links in hard[name])
            faults.reached("alignment-block")
            if keep_soft:
                kept["alignments"].extend(hard[heuristic])
            n_links += sum(map(len, hard[heuristic]))
            for name in gold_rows:
                gold_rows[name].extend(hard[name][k] for k in gold_here)
            del block, pairs, hard, soft   # freed before the next block is read
    return gold_rows, (kept if keep_soft else None), n_links
