"""Translation quality and decoding speed: trained model directories on a held-out slice
(``quality``), and the decoding cost of each model kind at equal output length (``speed``).

``quality``: for each ``NAME=MODEL_DIR`` the script translates the same lines with the same settings
(aligner.translate.translate: beam search, the model's own BPE), scores them with sacrebleu
(BLEU, TER; length ratio = hypothesis / reference length in sacrebleu's BLEU tokens) and times
the decoding (model loading excluded; one warm-up batch first). Speeds are also given as a
ratio to the ``--baseline`` model measured in the same run. Writes a markdown table.

Held-out check: with ``--train-src FILE ...`` (the training files of the models), the script
refuses test lines that occur in them (exact line match) unless ``--allow-overlap``.

    nice -n 10 python eval/run_translate.py quality \\
        --model transformer=runs/enfr-transformer --model hmm0=runs/enfr-hmm0 \\
        --baseline transformer \\
        --src /work/shared/data/enfr/train.wpt03-hansards-36.2.src \\
        --ref /work/shared/data/enfr/train.wpt03-hansards-36.2.tgt --first 500 \\
        --train-src /work/shared/data/enfr/train.src --output eval/results/translate_enfr.md

``speed``: untrained models of every kind (the project's default size, random weights, one
seed) decode the same inputs with the same beam, each hypothesis forced to a fixed output
length (EOS banned before it): the time then measures what one decoding step of each kind
costs, free of differences in output length. Input lengths come from real sentences (their
word counts, as subword counts; random ids).

    nice -n 10 python eval/run_translate.py speed \\
        --src /work/shared/data/enfr/train.wpt03-hansards-36.2.src --first 40 \\
        --output eval/results/translate_speed_cpu.md
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Any, Dict, List, Tuple

import torch


def parse_model(value: str) -> Tuple[str, str]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=MODEL_DIR, got {value!r}")
    return name, path


def read_slice(path: str, skip: int, first: int) -> List[str]:
    """Lines skip+1 .. skip+first of `path` (1-based, inclusive)."""
    from aligner.formats import read_lines

    lines = read_lines(path)[skip:skip + first]
    if len(lines) < first:
        sys.exit(f"{path}: only {len(lines)} lines after skipping {skip}, wanted {first}")
    return lines


def check_held_out(lines: List[str], train_files: List[str]) -> int:
    """Number of test lines that occur verbatim in any training file."""
    wanted = set(lines)
    seen = set()
    for path in train_files:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                line = line.rstrip("\n")
                if line in wanted:
                    seen.add(line)
    return sum(1 for line in lines if line in seen)


def describe(model_dir: str) -> Dict[str, str]:
    """Kind, Markov order, size and training length of a model directory (fwd)."""
    import json

    from aligner.training.loop import read_metrics

    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    model = config["models"]["fwd"]
    updates = "?"
    metrics = os.path.join(model_dir, "fwd", "metrics.tsv")
    if os.path.isfile(metrics):
        rows = read_metrics(metrics)
        if rows:
            updates = f"{best_update(rows)} of {rows[-1]['update']}"
    return {"kind": config["model_kind"], "markov": str(model.get("markov_order", 0)),
            "size": f"{model['d_model']}d {model['enc_layers']}+{model['dec_layers']}L",
            "updates": updates, "seed": str(config.get("seed", "?"))}


def best_update(rows: List[Dict[str, Any]]) -> int:
    """Update of the checkpoint kept as params.best (aligner.model_dir: lowest validation
    AER, else lowest validation perplexity, else the last); `rows`: read_metrics'."""
    for column in ("valid_aer", "valid_ppl"):
        scored = [(row[column], row["update"]) for row in rows if row[column] is not None]
        if scored:
            return min(scored)[1]
    return rows[-1]["update"]


def timed_translate(loaded, lines: List[str], beam: int, args, device: torch.device):
    """(translations, seconds) with one warm-up call on the first lines."""
    from aligner.translate import translate

    settings = dict(direction="fwd", beam=beam, max_len_a=args.max_len_a,
                    max_len_b=args.max_len_b, max_tokens=args.max_tokens, device=device)
    translate(loaded, lines[:8], **settings)                       # warm-up (CUDA init etc.)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    results = translate(loaded, lines, **settings)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return results, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    add_quality_arguments(commands.add_parser("quality", help="trained models: BLEU, TER, "
                                                             "length ratio, speed"))
    add_speed_arguments(commands.add_parser("speed", help="decoding cost per kind at equal "
                                                         "output length"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.command == "quality":
        quality(args)
    else:
        speed(args)


def add_quality_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", type=parse_model, required=True,
                        metavar="NAME=MODEL_DIR")
    parser.add_argument("--baseline", required=True, help="NAME of the speed reference.")
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--skip", type=int, default=0, help="Lines to skip before the slice.")
    parser.add_argument("--first", type=int, default=500, help="Lines in the slice.")
    parser.add_argument("--train-src", nargs="*", default=[],
                        help="Training source files: the slice must not occur in them.")
    parser.add_argument("--allow-overlap", action="store_true")
    parser.add_argument("--beam", type=int, nargs="+", default=[5],
                        help="Beam size(s): one row per model and beam.")
    parser.add_argument("--max-len-a", type=float, default=1.5)
    parser.add_argument("--max-len-b", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=1,
                        help="Timed runs per model and beam, interleaved (the fastest counts).")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default).")
    parser.add_argument("--output", default=None, help="Markdown file (default: stdout).")
    parser.add_argument("--save-translations", default=None,
                        help="Folder for one NAME.txt of translations per model.")


def quality(args: argparse.Namespace) -> None:
    from sacrebleu.metrics import BLEU, TER

    from aligner.distributed import resolve_device
    from aligner.model_dir import LoadedModelDir
    from aligner.utils import atomic_output

    names = [name for name, _ in args.model]
    if args.baseline not in names:
        sys.exit(f"--baseline {args.baseline} is not one of the models ({', '.join(names)})")
    device = resolve_device(args.device)
    sources = read_slice(args.src, args.skip, args.first)
    references = read_slice(args.ref, args.skip, args.first)
    overlap = check_held_out(sources, args.train_src) if args.train_src else None
    if overlap and not args.allow_overlap:
        sys.exit(f"{overlap} test lines occur in the training files; pick another slice")

    runs = [(name, model_dir, beam) for name, model_dir in args.model for beam in args.beam]
    loaded = {name: LoadedModelDir.load(model_dir, ("fwd",), "best", device)
              for name, model_dir in args.model}
    outputs, seconds = {}, {}
    for repeat in range(args.repeats):     # interleaved: load changes hit every model alike
        for name, _, beam in runs:
            results, took = timed_translate(loaded[name], sources, beam, args, device)
            outputs.setdefault((name, beam), results)
            seconds[name, beam] = min(seconds.get((name, beam), float("inf")), took)
            print(f"run {repeat + 1}: {name}, beam {beam}: {took:.1f}s", file=sys.stderr)
    rows = []
    for name, model_dir, beam in runs:
        results, took = outputs[name, beam], seconds[name, beam]
        hypotheses = [r.text for r in results]
        if args.save_translations:
            os.makedirs(args.save_translations, exist_ok=True)
            path = os.path.join(args.save_translations, f"{name}.beam{beam}.txt")
            with atomic_output(path) as out:
                out.writelines(h + "\n" for h in hypotheses)
        bleu_metric, ter_metric = BLEU(), TER()
        bleu = bleu_metric.corpus_score(hypotheses, [references])
        ter = ter_metric.corpus_score(hypotheses, [references])
        subwords = sum(len(r.subwords) for r in results)
        rows.append({"name": name, "beam": beam, **describe(model_dir), "bleu": bleu.score,
                     "ter": ter.score, "ratio": bleu.sys_len / max(1, bleu.ref_len),
                     "seconds": took, "lines_s": len(sources) / took,
                     "subwords_s": subwords / took,
                     "bleu_sig": str(bleu_metric.get_signature()),
                     "ter_sig": str(ter_metric.get_signature())})
        print(f"{name}, beam {beam}: BLEU {bleu.score:.2f} TER {ter.score:.2f}", file=sys.stderr)
    base = next(row for row in rows if row["name"] == args.baseline)   # at the first beam

    device_text = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)")
    lines = [
        "# Translation: quality and decoding speed", "",
        f"Command: `{' '.join(['python'] + sys.argv)}`  ",
        f"Test set: lines {args.skip + 1}-{args.skip + args.first} of `{args.src}` / "
        f"`{args.ref}`" + ("" if overlap is None else
                           f"; {overlap} of them occur in the training files "
                           f"({', '.join(f'`{p}`' for p in args.train_src)})") + "  ",
        f"Decoding: beam {' and '.join(map(str, args.beam))}, max length {args.max_len_a} x source + {args.max_len_b} "
        f"subwords, length-normalized scores, max {args.max_tokens} beam x source tokens per "
        f"batch; device {device_text}, torch {torch.__version__}. Times exclude model loading "
        f"and one warm-up call; fastest of {args.repeats} interleaved run(s).  ",
        f"Speed ratio = lines/s relative to `{args.baseline}` with beam {args.beam[0]} in "
        f"this run. "
        f"Length ratio = hypothesis / reference length (sacrebleu 13a tokens).  ",
        f"Signatures: {base['bleu_sig']}; {base['ter_sig']}", "",
        "| model | kind | Markov k | size | best at update | seed | beam | BLEU | TER | "
        "length ratio | lines/s | subwords/s | speed vs baseline |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row['name']} | {row['kind']} | {row['markov']} | {row['size']} | "
                     f"{row['updates']} | {row['seed']} | {row['beam']} | {row['bleu']:.2f} | {row['ter']:.2f} | "
                     f"{row['ratio']:.3f} | {row['lines_s']:.1f} | {row['subwords_s']:.0f} | "
                     f"{row['lines_s'] / base['lines_s']:.2f} |")
    with atomic_output(args.output) as out:
        out.write("\n".join(lines) + "\n")


# -- speed ------------------------------------------------------------------------------------

#: (name, kind, markov order) of the speed table; the first is the baseline
SPEED_MODELS = (("transformer", "transformer", 0), ("hmm0", "hmm0", 0), ("hmm1", "hmm1", 0),
                ("transformer k=1", "transformer", 1), ("transformer k=2", "transformer", 2),
                ("transformer k=4", "transformer", 4), ("hmm0 k=2", "hmm0", 2),
                ("hmm1 k=2", "hmm1", 2))


def add_speed_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--src", required=True, help="Real sentences: their lengths are used.")
    parser.add_argument("--skip", type=int, default=0)
    parser.add_argument("--first", type=int, default=40)
    parser.add_argument("--vocab", type=int, default=10000, help="Vocabulary size, both sides.")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=3, help="Encoder and decoder layers.")
    parser.add_argument("--ff-dim", type=int, default=1024)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--length-ratio", type=float, default=1.0,
                        help="Fixed output length = ratio x input length (at least 1).")
    parser.add_argument("--max-tokens", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=2, help="Timed runs (the fastest counts).")
    parser.add_argument("--only", nargs="*", default=None, help="Subset of model names.")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output", default=None)


def speed(args: argparse.Namespace) -> None:
    import numpy as np

    from aligner.data import inference_batches
    from aligner.distributed import resolve_device
    from aligner.models import build_model
    from aligner.translate import beam_search
    from aligner.utils import atomic_output

    device = resolve_device(args.device)
    lengths = [max(1, len(line.split())) for line in read_slice(args.src, args.skip, args.first)]
    rng = np.random.default_rng(args.seed)
    inputs = [torch.from_numpy(rng.integers(4, args.vocab, size=n)) for n in lengths]
    out_lengths = [max(1, int(round(args.length_ratio * n))) for n in lengths]
    batches = inference_batches(len(inputs), [n + 1 for n in lengths],
                                max(1, args.max_tokens // args.beam))
    models = [m for m in SPEED_MODELS if args.only is None or m[0] in args.only]

    def decode(model) -> None:
        for batch in batches:
            width = max(lengths[k] for k in batch) + 1
            src = torch.zeros(len(batch), width, dtype=torch.long)
            for row, k in enumerate(batch):
                src[row, :lengths[k]] = inputs[k]
                src[row, lengths[k]] = 2                                  # EOS
            limits = [out_lengths[k] for k in batch]
            beam_search(model, src.to(device), limits, args.beam, min_lengths=limits)

    decoders = {}
    for name, kind, order in models:
        torch.manual_seed(args.seed)
        config = dict(src_vocab_size=args.vocab, tgt_vocab_size=args.vocab,
                      d_model=args.d_model, n_heads=args.heads, enc_layers=args.layers,
                      dec_layers=args.layers, d_ff=args.ff_dim, dropout=0.0,
                      markov_order=order)
        decoders[name] = build_model(kind, config).to(device).eval()
        # warm-up on one short input (allocators, CUDA kernels)
        beam_search(decoders[name], torch.tensor([[5, 6, 2]], device=device), [2], args.beam)
    best = {name: float("inf") for name, _, _ in models}
    for repeat in range(args.repeats):          # interleaved: drift hits every model alike
        for name, _, _ in models:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            decode(decoders[name])
            if device.type == "cuda":
                torch.cuda.synchronize()
            best[name] = min(best[name], time.perf_counter() - start)
            print(f"run {repeat + 1}: {name}: {best[name]:.2f}s", file=sys.stderr)
    base = best[models[0][0]]
    device_text = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)")
    n_out = sum(out_lengths)
    lines = [
        "# Decoding speed per model kind at equal output length", "",
        f"Command: `{' '.join(['python'] + sys.argv)}`  ",
        f"Inputs: the word counts of lines {args.skip + 1}-{args.skip + args.first} of "
        f"`{args.src}` ({sum(lengths)} input, {n_out} output subwords; output length = "
        f"{args.length_ratio} x input, EOS banned before it), random ids.  ",
        f"Models: untrained, d_model {args.d_model}, {args.heads} heads, {args.layers}+"
        f"{args.layers} layers, feed-forward {args.ff_dim}, vocabulary {args.vocab}, seed "
        f"{args.seed}. Beam {args.beam}, max {args.max_tokens} beam x source tokens per batch. "
        f"Device {device_text}, torch {torch.__version__}. Fastest of {args.repeats} "
        f"interleaved runs.  ",
        f"Speed ratio = lines/s relative to `{models[0][0]}` in this run.", "",
        "| model | kind | Markov k | seconds | lines/s | output subwords/s | speed vs "
        f"{models[0][0]} |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, kind, order in models:
        lines.append(f"| {name} | {kind} | {order} | {best[name]:.2f} | "
                     f"{len(lengths) / best[name]:.2f} | {n_out / best[name]:.0f} | "
                     f"{base / best[name]:.2f} |")
    with atomic_output(args.output) as out:
        out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
