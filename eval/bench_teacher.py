"""The recipe's teacher stage as `align run` runs it, timed and measured: its wall time, CPU time
and peak resident memory (the largest process of the 407k en-fr job before 2026-11-30's
changes, eval/results/teacher_memory.md).

Reads the bitext, takes the teacher's sample of it (recipe.TEACHER_PAIRS lines, holding round
1's recipe.ROUND_PAIRS, chosen with --seed as `align run --seed` chooses them:
aligner/training/rounds.py teacher_lines), and runs the teacher in a "spawn" process of its
own with the job's own function (rounds.write_teacher_links_apart): the teacher trained,
written as a classical model directory to OUT/0 and its links of round 1's lines to
OUT/0/links.align. Prints one line:

    teacher: N lines (round 1's M), W s wall, C s CPU, peak RSS P kB (the teacher's process)

and, with --cells, the cells of the teacher's EM batches (both directions), padded and real,
and what their lexicon positions take as int32.

The peak is the teacher process's own (``getrusage(RUSAGE_CHILDREN)``), what `/usr/bin/time`
reports for a job whose largest process it is.

    python eval/bench_teacher.py -s big.en -t big.fr -o teacher_out [--seed 1]
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from typing import Tuple

import numpy as np

from aligner.formats import open_bitext
from aligner.malloc import limit_kernel_cache
from aligner.training import recipe
from aligner.training.classical import batches_of
from aligner.training.rounds import teacher_lines, write_teacher_links_apart
from aligner.training.teacher import TeacherConfig
from aligner.utils import AlignerError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-s", "--source", required=True)
    parser.add_argument("-t", "--target", required=True)
    parser.add_argument("-o", "--out", required=True,
                        help="a new folder: the teacher goes to OUT/0 (as MODEL_DIR/rounds/0)")
    parser.add_argument("--seed", type=int, default=1, help="the sample's seed (align run --seed)")
    parser.add_argument("--round-pairs", type=int, default=recipe.ROUND_PAIRS)
    parser.add_argument("--teacher-pairs", type=int, default=recipe.TEACHER_PAIRS)
    parser.add_argument("--cells", action="store_true",
                        help="also count the cells of the teacher's batches")
    args = parser.parse_args(argv)
    limit_kernel_cache()   # as the align command group does; glibc's allocator as it is, as
    # in the job's teacher process (keep_freed_memory runs in the command's own process only)
    try:
        if os.path.exists(args.out):
            raise AlignerError(f"{args.out}: exists; give a new folder")
        bitext = open_bitext(args.source, args.target)
        source, target, round_lines = teacher_lines(bitext, args.round_pairs, args.seed,
                                                    args.teacher_pairs)
    except AlignerError as error:
        print(f"bench_teacher: error: {error}", file=sys.stderr)
        return 1
    started = time.time()
    write_teacher_links_apart(source, target, os.path.join(args.out, "0", "links.align"),
                              round_lines)
    wall = time.time() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    in_round = len(source) if round_lines is None else len(round_lines)
    print(f"teacher: {len(source)} lines (round 1's {in_round}), {wall:.1f} s wall, "
          f"{usage.ru_utime + usage.ru_stime:.1f} s CPU, peak RSS {usage.ru_maxrss} kB "
          f"(the teacher's process)")
    if args.cells:
        padded, real = batch_cells(source, target)
        print(f"cells of the EM batches (both directions): {padded:,} padded "
              f"({padded * 4 / 1e6:.0f} MB as int32), {real:,} real ({real * 4 / 1e6:.0f} MB)")
    return 0


def batch_cells(source, target) -> Tuple[int, int]:
    """(padded, real) cells of the teacher's batches of these lines, both directions: what
    the EM keeps a lexicon position for (aligner/training/classical.py)."""
    lengths = [(np.zeros(len(s), dtype=np.int64), np.zeros(len(t), dtype=np.int64))
               for s, t in zip(source, target)]
    config = TeacherConfig()
    padded = real = 0
    for batch in batches_of(lengths, 1, 1, config.batch_cells, config.max_words):
        for direction in ("fwd", "rev"):
            cells = batch.cells(direction)
            padded, real = padded + cells.numel(), real + int(cells.sum())
    return padded, real


if __name__ == "__main__":
    sys.exit(main())
