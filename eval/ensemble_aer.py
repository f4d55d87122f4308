"""AER of `-H soft-average` for one model directory or several averaged (an ensemble).

Each direction's word-level soft matrices (aligner.extract.inference.soft_alignments_by_direction,
the --soft matrices of `align extract`) are averaged over the models, then combined by
soft-average at each --threshold and scored against gold sets that cover given lines of the
text. Prints one line per model and threshold and, with several models, per ensemble of the
first n models. ``--combine geometric`` / ``minimum`` replace the mean of the two directions'
probabilities (soft-average) by their geometric mean / their minimum (links above the
threshold), for comparison.

    python eval/ensemble_aer.py MODEL_DIR [MODEL_DIR ...] --text train.en train.fr \
        --gold dev ../shared/data/enfr/dev.talp 25001 \
        --gold trial ../shared/data/enfr/trial.talp 25201 [--threshold 0.5 0.55 ...]
"""
from __future__ import annotations

import argparse
from typing import Dict, List

import numpy as np
import torch

from aligner.extract import inference
from aligner.formats import Bitext, read_gold, read_lines, tokenize_line
from aligner.links.metrics import score_aer
from aligner.links.soft_symmetrize import soft_average
from aligner.model_dir import LoadedModelDir

#: how two directions' (I, J) word-level probabilities become one score per link
COMBINE = {"mean": None,   # aligner.links.soft_symmetrize.soft_average itself
           "geometric": lambda f, r: np.sqrt(f * r), "minimum": np.minimum}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="model directories (same BPE and vocabularies)")
    parser.add_argument("--text", nargs=2, required=True, metavar=("SRC", "TGT"))
    parser.add_argument("--gold", nargs=3, action="append", required=True,
                        metavar=("NAME", "TALP", "FIRST_LINE"),
                        help="a gold set and the 1-based text line of its first sentence")
    parser.add_argument("--threshold", type=float, nargs="+", default=[0.5],
                        help="one or more thresholds (default 0.5)")
    parser.add_argument("--combine", choices=sorted(COMBINE), default="mean",
                        help="mean = -H soft-average (default)")
    args = parser.parse_args()
    golds = [(name, read_gold(path), int(first) - 1) for name, path, first in args.gold]
    start = min(first for _, _, first in golds)
    stop = max(first + len(gold) for _, gold, first in golds)
    sources, targets = (read_lines(path)[start:stop] for path in args.text)
    bitext = Bitext([tokenize_line(line) for line in sources],
                    [tokenize_line(line) for line in targets], *args.text, first_line=start + 1)
    torch.set_num_threads(1)
    per_model: List[Dict[str, List[np.ndarray]]] = []

    def report(label: str, forward: List[np.ndarray], reverse: List[np.ndarray]) -> None:
        for threshold in args.threshold:
            if args.combine == "mean":
                links = [soft_average(f, r, threshold) for f, r in zip(forward, reverse)]
            else:
                combine = COMBINE[args.combine]
                links = [{(int(i), int(j)) for i, j in zip(*np.nonzero(combine(
                    np.asarray(f, np.float64), np.asarray(r, np.float64)) > threshold))}
                    for f, r in zip(forward, reverse)]
            scores = []
            for name, gold, first in golds:
                rows = links[first - start:first - start + len(gold)]
                score = score_aer(rows, gold)
                scores.append(f"{name} {100 * score.aer:.2f} ({100 * score.precision:.1f}/"
                              f"{100 * score.recall:.1f})")
            print(label, f"threshold {threshold}:", " ".join(scores))

    for model_dir in args.models:
        loaded = LoadedModelDir.load(model_dir, device=torch.device("cpu"))
        pairs = inference.encode_bitext(loaded, bitext)
        per_model.append(inference.soft_alignments_by_direction(
            loaded.models, pairs, ("fwd", "rev"), "hmm-posterior", parallel=True))
        report(model_dir, per_model[-1]["fwd"], per_model[-1]["rev"])
    for n in range(2, len(per_model) + 1):
        mean = {d: [sum(m[d][k] for m in per_model[:n]) / n for k in range(len(bitext))]
                for d in ("fwd", "rev")}
        report(f"ensemble of the first {n}", mean["fwd"], mean["rev"])


if __name__ == "__main__":
    main()
