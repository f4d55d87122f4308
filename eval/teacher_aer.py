"""AER of the classical teacher (aligner/training/teacher.py) on gold sets inside its training text.

Trains the teacher on every line of --text (as `align run` trains it on round 1's lines), then
scores each direction's links (a target word's most probable source word above 0.5, and the
converse) and the soft-average at each --threshold (aligner.links.metrics.score_aer, as `align
score-aer` scores) against gold sets whose sentences are lines of the text (``--gold NAME SRC
TGT GOLD``, eval/gold_sets.py, which finds them there). TeacherConfig fields are set with --set
KEY=VALUE. Prints one line per set and output, and the teacher's seconds. --write FILE writes
the soft-average links of every line at the first --threshold (Pharaoh; what `align run` writes
to MODEL_DIR/rounds/0/links.align with the recipe's threshold), a --guide for `align run`.

    python eval/teacher_aer.py --text train.en train.fr \
        --gold dev ../shared/data/enfr/dev.{src,tgt,talp} \
        --gold trial ../shared/data/enfr/trial.{src,tgt,talp} \
        [--threshold 0.45 0.5 0.55] [--set agreement=0 --set empty_prob=0.1 ...] \
        [--write teacher.align]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gold_sets import add_gold_argument, exit_on_error, load_gold_sets, locate  # noqa: E402

from aligner.formats import read_bitext, write_pharaoh  # noqa: E402
from aligner.links.combine import combine  # noqa: E402
from aligner.links.metrics import score_aer  # noqa: E402
from aligner.links.soft_symmetrize import soft_average  # noqa: E402
from aligner.training.teacher import TeacherConfig, soft_alignments  # noqa: E402


def _config(settings) -> TeacherConfig:
    """TeacherConfig with KEY=VALUE settings (ints, floats, booleans as 0/1)."""
    values = {}
    fields = {field.name: field for field in dataclasses.fields(TeacherConfig)}
    for setting in settings:
        key, _, value = setting.partition("=")
        if key not in fields:
            raise SystemExit(f"--set {setting}: no TeacherConfig field '{key}' "
                             f"(fields: {', '.join(fields)})")
        kind = type(getattr(TeacherConfig(), key))
        values[key] = bool(int(value)) if kind is bool else kind(value)
    return TeacherConfig(**values)


def _best_links(matrix: np.ndarray, over_source: bool):
    """One direction's own links: each target word's (over_source) or source word's most
    probable partner, where its probability exceeds 0.5."""
    if over_source:   # fwd: p(source i | target j), columns are target words
        return {(int(matrix[:, j].argmax()), j) for j in range(matrix.shape[1])
                if matrix.shape[0] and matrix[:, j].max() > 0.5}
    return {(i, int(matrix[i].argmax())) for i in range(matrix.shape[0])
            if matrix.shape[1] and matrix[i].max() > 0.5}


@exit_on_error("teacher_aer.py")
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text", nargs=2, required=True, metavar=("SRC", "TGT"))
    add_gold_argument(parser, required=False,
                      use="found among the lines of --text (none: only --write)")
    parser.add_argument("--threshold", type=float, nargs="+", default=[0.5])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a TeacherConfig field (repeatable)")
    parser.add_argument("--write", metavar="FILE",
                        help="write every line's soft-average links at the first --threshold")
    args = parser.parse_args()
    config = _config(args.set)
    gold_sets = load_gold_sets(args.gold)
    text = read_bitext(*args.text)
    sources, targets = text.source, text.target
    locate(gold_sets, sources, targets, " ".join(args.text))
    start = time.time()
    soft = soft_alignments(sources, targets, config)
    seconds = time.time() - start
    print(f"teacher: {len(sources)} lines in {seconds:.1f} s, {config}")
    if args.write:
        write_pharaoh(args.write, combine("soft-average", args.threshold[0], soft=soft))
    for gold_set in gold_sets:
        name, gold = gold_set.name, gold_set.golds
        lines = range(gold_set.offset, gold_set.offset + gold_set.size)
        outputs = {"fwd": [_best_links(soft["fwd"][n], True) for n in lines],
                   "rev": [_best_links(soft["rev"][n], False) for n in lines]}
        for threshold in args.threshold:
            outputs[f"soft-average {threshold:g}"] = [
                soft_average(soft["fwd"][n], soft["rev"][n], threshold) for n in lines]
        for output, links in outputs.items():
            score = score_aer(links, gold)
            print(f"{name}\t{output}\tAER {100 * score.aer:.1f}\tP {100 * score.precision:.1f}"
                  f"\tR {100 * score.recall:.1f}")


if __name__ == "__main__":
    main()
