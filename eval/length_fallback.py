"""AER of a gold-free per-line fallback: the recipe's links, except on lines far longer than
the bitext's usual lines, which take the classical aligner's links (`--model classical`).

The rule needs no gold: q = the `--quantile` of max(source words, target words) over the lines
of the bitext (`--text`, the text both models were trained on); a line whose longer side has
more than `factor` · q words takes the classical model's links. Each `--factor` is scored on
every gold set, next to the two models alone.

    python eval/length_fallback.py --text c.src c.tgt --neural MODEL --classical CLASSICAL \\
        --gold dev ../shared/data/jaen/dev.src ../shared/data/jaen/dev.tgt \\
        ../shared/data/jaen/dev.talp --factor 1 1.5 2 3

Both model directories align the gold lines with `align extract`'s defaults (the recipe's
calibrated soft-average, the classical model's soft-average at 0.5).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from aligner.links.metrics import score_aer  # noqa: E402
from gold_sets import add_gold_argument, load_gold_sets  # noqa: E402


def _lengths(path: str) -> np.ndarray:
    with open(path, encoding="utf-8") as handle:
        return np.array([len(line.split()) for line in handle])


def _links(model: str, src: str, tgt: str, workdir: str, name: str):
    out = os.path.join(workdir, name)
    subprocess.run(["align", "extract", model, "-s", src, "-t", tgt, "-o", out, "-q",
                    "--overwrite"], check=True)
    with open(out, encoding="utf-8") as handle:
        return [{tuple(map(int, link.split("-"))) for link in line.split()} for line in handle]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text", nargs=2, metavar=("SRC", "TGT"), required=True)
    parser.add_argument("--neural", required=True, help="the recipe's model directory")
    parser.add_argument("--classical", required=True, help="a --model classical directory")
    parser.add_argument("--quantile", type=float, default=0.99)
    parser.add_argument("--factor", type=float, nargs="+", default=[1.0, 1.5, 2.0])
    parser.add_argument("--ratio", type=float, nargs="*", default=[],
                        help="also score the fallback where the recipe's line has fewer than "
                             "this share of the classical aligner's links (a line where the "
                             "recipe's recall collapsed), whatever its length")
    parser.add_argument("--join", type=int, default=1,
                        help="also score the gold lines joined N at a time, end to end (their "
                             "links shifted): long lines with gold, where a set has none")
    add_gold_argument(parser)
    args = parser.parse_args()
    longest = np.maximum(_lengths(args.text[0]), _lengths(args.text[1]))
    usual = float(np.quantile(longest, args.quantile))
    print(f"q{args.quantile:g} of the longer side over {len(longest)} lines: {usual:g} words\n")
    print("| set | recipe | classical | " + " | ".join(
        f"fallback over {f:g}·q = {f * usual:g} words (lines)" for f in args.factor)
        + "".join(f" | fallback under {r:g} of its links (lines)" for r in args.ratio) + " |")
    print("|---|---|---|" + "---|" * (len(args.factor) + len(args.ratio)))
    with tempfile.TemporaryDirectory() as workdir:
        for gold in load_gold_sets(args.gold):
            for group in sorted({1, args.join}):
                name, source, target, golds = _joined(gold, group, workdir)
                _score(args, usual, name, source, target, golds, workdir)


def _joined(gold, group: int, workdir: str):
    """(name, source file, target file, gold alignments) of the set's lines joined `group` at
    a time (1: the set as it is)."""
    if group == 1:
        return gold.name, gold.source, gold.target, gold.golds
    from aligner.formats import GoldAlignment

    sources, targets, golds = [], [], []
    for start in range(0, len(gold.sources), group):
        s_words, t_words, sure, possible = [], [], set(), set()
        for k in range(start, min(start + group, len(gold.sources))):
            shift = (len(s_words), len(t_words))
            sure |= {(i + shift[0], j + shift[1]) for i, j in gold.golds[k].sure}
            possible |= {(i + shift[0], j + shift[1]) for i, j in gold.golds[k].possible}
            s_words += gold.sources[k]
            t_words += gold.targets[k]
        sources.append(" ".join(s_words))
        targets.append(" ".join(t_words))
        golds.append(GoldAlignment(sure, possible))
    paths = []
    for side, lines in (("src", sources), ("tgt", targets)):
        paths.append(os.path.join(workdir, f"{gold.name}.joined{group}.{side}"))
        with open(paths[-1], "w", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in lines))
    return f"{gold.name}, joined {group} at a time", paths[0], paths[1], golds


def _score(args, usual: float, name: str, source: str, target: str, golds, workdir: str
           ) -> None:
    """One table row: the recipe, the classical aligner and each fallback on one set."""
    neural = _links(args.neural, source, target, workdir, "n.align")
    classical = _links(args.classical, source, target, workdir, "c.align")
    sizes = np.maximum(_lengths(source), _lengths(target))
    cells = [f"{100 * score_aer(neural, golds).aer:.2f}",
             f"{100 * score_aer(classical, golds).aer:.2f}"]
    for factor in args.factor:
        over = sizes > factor * usual
        mixed = [c if o else n for n, c, o in zip(neural, classical, over)]
        cells.append(f"{100 * score_aer(mixed, golds).aer:.2f} ({int(over.sum())})")
    for ratio in args.ratio:
        sparse = [len(n) < ratio * len(c) for n, c in zip(neural, classical)]
        mixed = [c if o else n for n, c, o in zip(neural, classical, sparse)]
        cells.append(f"{100 * score_aer(mixed, golds).aer:.2f} ({sum(sparse)})")
    print(f"| {name} | " + " | ".join(cells) + " |")

if __name__ == "__main__":
    main()
