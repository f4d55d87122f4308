"""Benchmark: training speed of hmm0 / hmm1 as a ratio of the baseline transformer's tokens/s.

Same batches, same run: the models are built side by side with the same transformer sizes and
take turns on every batch (the order rotates per batch, so drifting machine load hits all
alike). A step is loss + backward + Adam update, label smoothing 0.1, as in `align train`,
with the recipe's dropout (0: aligner/training/recipe.py MODEL_OPTIONS) unless --dropout is
given (the script used 0.1 for every result made before 2026-11-28; `--dropout 0.1` repeats
those). The first --warmup batches are not timed. Batches come from an encoded corpus
that `align train` wrote into a model directory (its ``corpus`` folder and ``config.json``).

    align train -s train.src -t train.tgt -o /tmp/prep --directions fwd --max-updates 1
    python eval/bench_hmm_speed.py --model-dir /tmp/prep --output eval/results/hmm_speed.md

Variants are ``KIND`` or ``KIND:key=value,key=value`` (model options, e.g.
``hmm0:lexicon_dim=64``); the first variant is the reference (ratio 1).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any, Dict, List, Tuple

DEFAULT_VARIANTS = ["transformer", "hmm0", "hmm0:lexicon_dim=64", "hmm0:lexicon_sample=1000",
                    "hmm0:lexicon_dim=64,lexicon_sample=1000", "hmm1",
                    "hmm1:lexicon_dim=64,lexicon_sample=1000"]


def parse_variant(text: str) -> Tuple[str, Dict[str, Any]]:
    """'hmm0:lexicon_dim=64,lexicon_chunk=0' -> ('hmm0', {'lexicon_dim': 64, ...})."""
    kind, _, rest = text.partition(":")
    options: Dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return kind, options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True,
                        help="model directory written by align train (corpus + config.json; "
                             "of a self-training run: one of its rounds, MODEL_DIR/rounds/N)")
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    parser.add_argument("--max-tokens", type=int, default=512, help="padded tokens per batch")
    parser.add_argument("--batches", type=int, default=8, help="timed batches")
    parser.add_argument("--warmup", type=int, default=1, help="untimed batches first")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    parser.add_argument("--ff-dim", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dropout", type=float, default=None,
                        help="dropout of every variant (default: the recipe's, "
                             "aligner/training/recipe.py MODEL_OPTIONS)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", default=None)
    parser.add_argument("--guide-weight", type=float, default=0.0,
                        help="> 0: time the guided loss of the recipe's later rounds instead "
                             "(NLL + weight x cross-entropy of the posterior against a guide; "
                             "here a diagonal guide, one link per target word), for the "
                             "kinds that train their posterior (hmm0, hmm1)")
    parser.add_argument("--system-malloc", action="store_true",
                        help="leave glibc's allocator as it is (by default the benchmark keeps "
                             "freed memory for reuse, as the align command does: "
                             "aligner/malloc.py)")
    parser.add_argument("--profile", type=int, default=0,
                        help="afterwards, torch-profile this many steps of the first variant and "
                             "print its operators by self CPU time, grouped by input shape "
                             "(stderr)")
    args = parser.parse_args()

    import torch

    from aligner.constants import PAD_ID
    from aligner.data import EncodedCorpus, TokenBatcher, make_batch
    from aligner.models import build_model
    from aligner.training import recipe
    from aligner.training.guidance import guide_matrix
    from aligner.training.loop import guided_loss
    from aligner.utils import atomic_output

    if not args.system_malloc:
        from aligner.malloc import keep_freed_memory
        keep_freed_memory()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    with open(os.path.join(args.model_dir, "config.json"), encoding="utf-8") as handle:
        saved = json.load(handle)
    sizes = next(iter(saved["models"].values()))
    corpus = EncodedCorpus.open(os.path.join(args.model_dir, "corpus"))
    batcher = TokenBatcher.from_corpus(corpus, args.max_tokens, seed=1, shuffle=True)
    indices = batcher.epoch_batches(0)[:args.warmup + args.batches]
    batches = [make_batch([corpus.source(k) for k in b], [corpus.target(k) for k in b],
                          "fwd").to(device) for b in indices]
    base = dict(src_vocab_size=sizes["src_vocab_size"], tgt_vocab_size=sizes["tgt_vocab_size"],
                d_model=args.d_model, n_heads=args.heads, enc_layers=args.layers,
                dec_layers=args.layers, d_ff=args.ff_dim,
                dropout=(recipe.MODEL_OPTIONS["dropout"] if args.dropout is None
                         else args.dropout))

    def diagonal_guide(batch) -> "torch.Tensor":
        """(B, I+1, J+1): target word i linked to source word round(i·J/I), EOS to EOS."""
        links = []
        for row in range(batch.size):
            target = int(batch.tgt_out[row].ne(PAD_ID).sum()) - 1    # words, EOS excluded
            source = int(batch.src[row].ne(PAD_ID).sum()) - 1
            links.append([(min(source - 1, round(i * source / max(target, 1))), i)
                          for i in range(target)] + [(source, target)])
        return guide_matrix(links, "fwd", batch.tgt_out.size(1), batch.src.size(1)).to(device)

    runs: List[Dict[str, Any]] = []
    for text in args.variants:
        kind, options = parse_variant(text)
        torch.manual_seed(1)
        model = build_model(kind, dict(base, **options)).to(device).train()
        runs.append({"name": text, "model": model, "seconds": 0.0, "tokens": 0,
                     "optimizer": torch.optim.Adam(model.parameters(), lr=1e-4)})

    guides = [diagonal_guide(batch) if args.guide_weight > 0 else None for batch in batches]

    def step(run: Dict[str, Any], batch, guide) -> Tuple[float, int]:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        if guide is not None:
            loss, n_tokens = guided_loss(run["model"], batch.src, batch.tgt_in, batch.tgt_out,
                                         0.1, guide, args.guide_weight)
        else:
            loss, n_tokens = run["model"].loss(batch.src, batch.tgt_in, batch.tgt_out, 0.1)
        run["optimizer"].zero_grad()
        (loss / n_tokens).backward()
        run["optimizer"].step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, int(n_tokens)

    for number, (batch, guide) in enumerate(zip(batches, guides)):
        shift = number % len(runs)
        for run in runs[shift:] + runs[:shift]:
            seconds, tokens = step(run, batch, guide)
            if number >= args.warmup:
                run["seconds"] += seconds
                run["tokens"] += tokens
        print(f"batch {number + 1}/{len(batches)} {tuple(batch.src.shape)}->"
              f"{tuple(batch.tgt_out.shape)}: " + ", ".join(
                  f"{r['name']} {r['tokens'] / max(r['seconds'], 1e-9):.0f} tok/s" for r in runs),
              file=sys.stderr)

    if args.profile:
        from torch.profiler import profile
        with profile(record_shapes=True) as profiler:
            for number in range(args.warmup, min(len(batches), args.warmup + args.profile)):
                step(runs[0], batches[number], guides[number])
        print(profiler.key_averages(group_by_input_shape=True).table(
            sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15),
              file=sys.stderr)

    reference = runs[0]["tokens"] / runs[0]["seconds"]
    timed = batches[args.warmup:]
    src_tokens = sum(int(b.src.ne(0).sum()) for b in timed)
    pairs = sum(b.size for b in timed)
    with atomic_output(args.output) as out:
        out.write("# Training speed of the direct HMM relative to the transformer baseline\n\n")
        out.write(f"Command: `python eval/bench_hmm_speed.py {' '.join(sys.argv[1:])}`  \n")
        out.write(f"Device: {device.type} ({platform.machine()}), torch {torch.__version__}, "
                  f"{torch.get_num_threads()} thread(s). Sizes: d_model {args.d_model}, "
                  f"{args.heads} heads, {args.layers}+{args.layers} layers, ff {args.ff_dim}, "
                  f"dropout {base['dropout']}, "
                  f"vocabularies {sizes['src_vocab_size']}/{sizes['tgt_vocab_size']}. "
                  f"{len(timed)} timed batches of <= {args.max_tokens} padded tokens "
                  f"({pairs} pairs, {src_tokens / pairs:.1f} source subwords + EOS per pair on "
                  f"average), after {args.warmup} untimed; the models take turns on each batch."
                  f"  \n\n")
        out.write("| model (options) | target tokens/s | ratio to the first row |\n")
        out.write("|---|---|---|\n")
        for run in runs:
            speed = run["tokens"] / run["seconds"]
            out.write(f"| {run['name']} | {speed:.0f} | {speed / reference:.1%} |\n")


if __name__ == "__main__":
    main()
