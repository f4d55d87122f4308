"""AER of `-H soft-average` for one model directory or several averaged (an ensemble).

Each direction's word-level soft matrices
(aligner.extract.inference.soft_alignments_by_direction, the --soft matrices of `align extract`)
are averaged over the models, then combined by soft-average at each --threshold and scored
(aligner.links.metrics.score_aer, as `align score-aer` scores) against gold sets whose sentences
are lines of the text (``--gold NAME SRC TGT GOLD``, eval/gold_sets.py, which finds them there).
Prints one line per model and threshold and, with several models, per ensemble of the first n
models. ``--combine geometric`` / ``minimum`` replace the mean of the two directions'
probabilities (soft-average) by their geometric mean / their minimum (links above the
threshold), for comparison. ``--calibration BETA ...`` also scores, for a model directory
with a calibration.json (`align calibrate`, or written by `align run`), the thresholds per line
length it gives (aligner/links/calibration.py): each length bucket's expected-F_beta threshold
itself ("expected-F beta B"), and each --threshold scaled by the ratio of the bucket's to the
shortest lines' ("calibrated beta B": what `align extract` does, at beta 0.7). ``--first-weight
W ...`` also scores each ensemble with the first model's matrices weighted W and the others
sharing 1 - W (a neural model mixed with a classical one, say). The matrices
here are the exact float32 ones (`align extract` uses the lexicon shortlist and, on a CPU
with bf16 instructions, bf16), their subwords pooled as `align extract` pools them by default
(the model directory's calibration's ``--subword-pooling``).

    python eval/ensemble_aer.py MODEL_DIR [MODEL_DIR ...] --text train.en train.fr \
        --gold dev ../shared/data/enfr/dev.{src,tgt,talp} \
        --gold trial ../shared/data/enfr/trial.{src,tgt,talp} [--threshold 0.5 0.55 ...]
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gold_sets import add_gold_argument, exit_on_error, load_gold_sets, locate  # noqa: E402

from aligner.extract import inference  # noqa: E402
from aligner.formats import Bitext, read_bitext  # noqa: E402
from aligner.extract.calibrate import read_calibration  # noqa: E402
from aligner.links.calibration import Calibration, LengthThresholds  # noqa: E402
from aligner.links.metrics import score_aer  # noqa: E402
from aligner.links.soft_symmetrize import soft_average  # noqa: E402
from aligner.model_dir import LoadedModelDir  # noqa: E402

#: how two directions' (I, J) word-level probabilities become one score per link
COMBINE = {"mean": None,   # aligner.links.soft_symmetrize.soft_average itself
           "geometric": lambda f, r: np.sqrt(f * r), "minimum": np.minimum}


@exit_on_error("ensemble_aer.py")
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="model directories (same BPE and vocabularies)")
    parser.add_argument("--text", nargs=2, required=True, metavar=("SRC", "TGT"))
    add_gold_argument(parser, use="found among the lines of --text")
    parser.add_argument("--threshold", type=float, nargs="+", default=[0.5],
                        help="one or more thresholds (default 0.5)")
    parser.add_argument("--combine", choices=sorted(COMBINE), default="mean",
                        help="mean = -H soft-average (default)")
    parser.add_argument("--calibration", type=float, nargs="+", default=[], metavar="BETA",
                        help="also score each model's calibration.json thresholds at these "
                             "betas (see above)")
    parser.add_argument("--first-weight", type=float, nargs="+", default=[], metavar="W",
                        help="also score each ensemble with the first model's matrices at "
                             "weight W and the others sharing 1 - W (default: equal weights "
                             "only)")
    args = parser.parse_args()
    gold_sets = load_gold_sets(args.gold)
    text = read_bitext(*args.text)
    locate(gold_sets, text.source, text.target, " ".join(args.text))
    start = min(gold_set.offset for gold_set in gold_sets)
    stop = max(gold_set.offset + gold_set.size for gold_set in gold_sets)
    bitext = Bitext(text.source[start:stop], text.target[start:stop], *args.text,
                    first_line=start + 1)
    del text
    torch.set_num_threads(1)
    per_model: List[Dict[str, List[np.ndarray]]] = []

    def report(label: str, forward: List[np.ndarray], reverse: List[np.ndarray],
               calibration=None) -> None:
        rules = [(f"threshold {t}:", t) for t in args.threshold]
        if calibration is not None:
            for beta in args.calibration:
                expected = calibration.expected_f_thresholds(beta)
                rules.append((f"expected-F beta {beta} "
                              f"{'/'.join(f'{v:.2f}' for v in expected)}:",
                              LengthThresholds(calibration.edges, expected)))
                rules += [(f"calibrated beta {beta} from {t}:", calibration.thresholds(t, beta))
                          for t in args.threshold]
        for name, threshold in rules:
            if args.combine == "mean" or not isinstance(threshold, float):
                links = [soft_average(f, r, threshold) for f, r in zip(forward, reverse)]
            else:
                combine = COMBINE[args.combine]
                links = [{(int(i), int(j)) for i, j in zip(*np.nonzero(combine(
                    np.asarray(f, np.float64), np.asarray(r, np.float64)) > threshold))}
                    for f, r in zip(forward, reverse)]
            scores = []
            for gold_set in gold_sets:
                first = gold_set.offset - start
                score = score_aer(links[first:first + gold_set.size], gold_set.golds)
                scores.append(f"{gold_set.name} {100 * score.aer:.2f} "
                              f"({100 * score.precision:.1f}/"
                              f"{100 * score.recall:.1f})")
            print(label, name, " ".join(scores))

    for model_dir in args.models:
        loaded = LoadedModelDir.load(model_dir, device=torch.device("cpu"))
        pairs = inference.encode_bitext(loaded, bitext)
        per_model.append(inference.soft_alignments_by_direction(   # as align extract pools
            loaded.models, pairs, ("fwd", "rev"), "hmm-posterior", parallel=True,
            pooling=loaded.subword_pooling()))
        record = read_calibration(model_dir) if args.calibration else None
        report(model_dir, per_model[-1]["fwd"], per_model[-1]["rev"],
               Calibration.from_dict(record) if record else None)
    for n in range(2, len(per_model) + 1):
        mean = {d: [sum(m[d][k] for m in per_model[:n]) / n for k in range(len(bitext))]
                for d in ("fwd", "rev")}
        report(f"ensemble of the first {n}", mean["fwd"], mean["rev"])
        for weight in args.first_weight:
            shares = [weight] + [(1 - weight) / (n - 1)] * (n - 1)
            mix = {d: [sum(w * m[d][k] for w, m in zip(shares, per_model[:n]))
                       for k in range(len(bitext))] for d in ("fwd", "rev")}
            report(f"ensemble of the first {n}, the first at weight {weight}", mix["fwd"],
                   mix["rev"])


if __name__ == "__main__":
    main()
