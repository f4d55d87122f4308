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
    add_gold_argument(parser)
    args = parser.parse_args()
    longest = np.maximum(_lengths(args.text[0]), _lengths(args.text[1]))
    usual = float(np.quantile(longest, args.quantile))
    print(f"q{args.quantile:g} of the longer side over {len(longest)} lines: {usual:g} words\n")
    print("| set | recipe | classical | " + " | ".join(
        f"fallback over {f:g}·q = {f * usual:g} words (lines)" for f in args.factor) + " |")
    print("|---|---|---|" + "---|" * len(args.factor))
    with tempfile.TemporaryDirectory() as workdir:
        for gold in load_gold_sets(args.gold):
            golds = gold.golds
            neural = _links(args.neural, gold.source, gold.target, workdir, "n.align")
            classical = _links(args.classical, gold.source, gold.target, workdir, "c.align")
            sizes = np.maximum(_lengths(gold.source), _lengths(gold.target))
            cells = [f"{100 * score_aer(neural, golds).aer:.2f}",
                     f"{100 * score_aer(classical, golds).aer:.2f}"]
            for factor in args.factor:
                over = sizes > factor * usual
                mixed = [c if o else n for n, c, o in zip(neural, classical, over)]
                cells.append(f"{100 * score_aer(mixed, golds).aer:.2f} ({int(over.sum())})")
            print(f"| {gold.name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
