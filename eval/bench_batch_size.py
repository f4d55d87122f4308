"""Benchmark: extraction pairs/s by batch size (``max_tokens``), one direction, one process.

Times ``aligner.extract.inference.soft_alignments`` of the same sentence pairs at each batch size,
in this process with ``--threads`` torch threads (a warm-up batch first). Two kinds of models:

* ``--model-dir DIR``: a trained model directory (its fwd model, the kind's first method);
* ``--random KIND ...``: models of that kind at the recipe's size (d_model 128, 3+3 layers,
  the linear 64-dim lexicon for the HMMs) with random weights and the vocabulary of
  ``--model-dir``: speed does not depend on what the weights are.

    python eval/bench_batch_size.py --model-dir /tmp/wj2/model --src train.en --tgt train.fr \\
        --pairs 1000 --max-tokens 4000 2000 1000 500 250 --random transformer hmm0
"""
from __future__ import annotations

import argparse
import time
from typing import List, Tuple

import torch

from aligner.extract.inference import encode_bitext, soft_alignments
from aligner.formats import Bitext, read_bitext
from aligner.model_dir import LoadedModelDir
from aligner.models import model_class
from aligner.models.base import AlignmentModel


def random_model(kind: str, src_vocab: int, tgt_vocab: int) -> AlignmentModel:
    """A model of `kind` at the recipe's size with random weights."""
    cls = model_class(kind)
    fields = cls.config_class.__dataclass_fields__
    options = dict(src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab, d_model=128, n_heads=4,
                   enc_layers=3, dec_layers=3, d_ff=512, lexicon_dim=64,
                   lexicon_activation="linear")
    return cls(cls.config_class(**{k: v for k, v in options.items() if k in fields})).eval()


def pairs_per_second(model: AlignmentModel, pairs, method: str, max_tokens: int) -> float:
    start = time.perf_counter()
    soft_alignments(model, pairs, "fwd", method, max_tokens=max_tokens)
    return len(pairs) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--tgt", required=True)
    parser.add_argument("--first-line", type=int, default=3001, help="1-based")
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[4000, 2000, 1000, 500])
    parser.add_argument("--random", nargs="*", default=[], metavar="KIND")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bitext = read_bitext(args.src, args.tgt)
    start = args.first_line - 1
    lines = Bitext(bitext.source[start:start + args.pairs], bitext.target[start:start + args.pairs],
                   args.src, args.tgt)
    loaded = LoadedModelDir.load(args.model_dir, ("fwd",), "best", torch.device("cpu"))
    pairs = encode_bitext(loaded, lines)
    trained = loaded.models["fwd"]
    models: List[Tuple[str, AlignmentModel]] = [(f"{loaded.config.model_kind} (trained)", trained)]
    models += [(f"{kind} (random)", random_model(kind, len(loaded.src_vocab),
                                                 len(loaded.tgt_vocab))) for kind in args.random]
    print(f"{len(pairs)} pairs (lines {args.first_line}-{args.first_line + len(pairs) - 1} of "
          f"{args.src}), 1 direction, {args.threads} thread(s); pairs/s by max_tokens\n")
    print("| model | method | " + " | ".join(str(m) for m in args.max_tokens) + " |")
    print("|---|---|" + "---|" * len(args.max_tokens))
    with torch.inference_mode():
        for name, model in models:
            method = type(model).METHODS[0]
            soft_alignments(model, pairs[:30], "fwd", method)           # warm-up
            speeds = [pairs_per_second(model, pairs, method, m) for m in args.max_tokens]
            print(f"| {name} | {method} | " + " | ".join(f"{s:.0f}" for s in speeds) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
