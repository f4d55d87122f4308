#!/usr/bin/env python
"""AER table of one model directory: extraction methods × {fwd, rev, symmetrized} × gold sets.

Trains the model first when ``--train "ALIGN TRAIN ARGS"`` is given (runs ``align train -o
MODEL_DIR ARGS`` and times it), otherwise takes an existing model directory. Then it aligns
every gold set's sentences with every method in ``--methods`` and writes a Markdown report
(table, exact command lines, data sizes, model settings, wall times) plus a TSV with every
number (AER, precision, recall, link counts) into ``--output``.

A method is ``NAME`` or ``NAME:KEY=VALUE[,KEY=VALUE...]`` (options passed to the model's
``alignment_scores``), e.g. ``attention:layer=2``, ``attention-avg``, ``layer-sgd:sgd_steps=3``.

Gold sets (``--sets``, from the shared data folder, never copied into the repository):
``enfr-dev`` (200 pairs), ``enfr-trial`` (37), ``deen-test`` (508), ``deen-bicici`` (100).
The project's benchmark convention is to append these sentences to the training text
(``align train`` on train + dev + trial), then score them.

Example (the baseline transformer on en-fr; the real-data run of eval/results)::

    python eval/run_aer.py --model-dir runs/enfr-transformer \\
        --methods attention,attention:layer=3,attention-avg \\
        --sets enfr-dev,enfr-trial --output eval/results/enfr_transformer.md
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = Path(os.environ.get("ALIGNER_SHARED_DATA", ROOT.parent / "shared" / "data"))

GOLD_SETS = {
    "enfr-dev": ("enfr/dev.src", "enfr/dev.tgt", "enfr/dev.talp"),
    "enfr-trial": ("enfr/trial.src", "enfr/trial.tgt", "enfr/trial.talp"),
    "deen-test": ("deen/test.src", "deen/test.tgt", "deen/test.talp"),
    "deen-bicici": ("deen/bicici100.src", "deen/bicici100.tgt", "deen/bicici100.talp"),
}


def parse_method(spec: str) -> Tuple[str, str, Dict[str, Any]]:
    """'attention:layer=2' -> (label, 'attention', {'layer': 2})."""
    import json

    name, _, rest = spec.partition(":")
    options: Dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"run_aer.py: bad method option '{item}' in '{spec}' (KEY=VALUE)")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    label = name + "".join(f" {k}={v}" for k, v in options.items())
    return label, name, options


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--train", default=None, metavar="ARGS",
                        help="Train first: 'align train -o MODEL_DIR ARGS' (one quoted string).")
    parser.add_argument("--methods", default="attention,attention-avg",
                        help="Comma-separated method specs (see the module docstring).")
    parser.add_argument("--sets", default="enfr-dev,enfr-trial",
                        help=f"Comma-separated gold sets: {', '.join(GOLD_SETS)}.")
    parser.add_argument("--heuristics", default="grow-diag",
                        help="Symmetrization heuristics (comma-separated).")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="Shared data folder.")
    parser.add_argument("--checkpoint", default="best", choices=["best", "last"])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--title", default=None, help="Report title.")
    parser.add_argument("--output", required=True, help="Markdown report (a .tsv goes beside).")
    args = parser.parse_args(argv)

    command_line = "python eval/run_aer.py " + " ".join(shlex.quote(a) for a in argv)
    train_seconds = None
    train_command = None
    if args.train is not None:
        train_command = ["align", "train", "-o", args.model_dir] + shlex.split(args.train)
        start = time.time()
        subprocess.run(train_command, check=True)
        train_seconds = time.time() - start

    import torch

    from aligner import constants as C
    from aligner.distributed import resolve_device
    from aligner.extract.inference import extract_all
    from aligner.formats import read_bitext, read_gold
    from aligner.links.metrics import score_aer
    from aligner.model_dir import CORPUS_DIR, LoadedModelDir
    from aligner.training.loop import read_metrics

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    loaded = LoadedModelDir.load(args.model_dir, checkpoint=args.checkpoint, device=device)
    methods = [parse_method(spec) for spec in args.methods.split(",") if spec]
    heuristics = [h for h in args.heuristics.split(",") if h]
    columns = ["fwd", "rev"] + heuristics
    sets = [s for s in args.sets.split(",") if s]
    unknown = [s for s in sets if s not in GOLD_SETS]
    if unknown:
        raise SystemExit(f"run_aer.py: unknown gold set(s) {unknown}; "
                         f"choose from {list(GOLD_SETS)}")

    results: Dict[Tuple[str, str, str], Any] = {}
    timings: Dict[str, float] = {}
    sizes: Dict[str, int] = {}
    for name in sets:
        src, tgt, gold_path = (os.path.join(args.data, p) for p in GOLD_SETS[name])
        bitext = read_bitext(src, tgt)
        gold = read_gold(gold_path, n_sentences=len(bitext))
        sizes[name] = len(bitext)
        for label, method, options in methods:
            start = time.time()
            out = extract_all(loaded, bitext, method, heuristics=heuristics, device=device,
                              options=options)
            timings[f"{name} {label}"] = time.time() - start
            for column in columns:
                results[(name, label, column)] = score_aer(out[column], gold)

    config = loaded.config
    corpus_meta = os.path.join(args.model_dir, CORPUS_DIR, "corpus.json")
    corpus_stats = ""
    if os.path.isfile(corpus_meta):
        import json

        stats = json.load(open(corpus_meta, encoding="utf-8"))
        corpus_stats = (f"{stats['n_kept']:,} of {stats['n_input']:,} pairs kept "
                        f"({stats['src_tokens']:,} source / {stats['tgt_tokens']:,} target "
                        f"subwords)")
    updates = {}
    for direction in config.directions:
        metrics = Path(args.model_dir, direction, C.METRICS_NAME)
        rows = read_metrics(str(metrics)) if metrics.is_file() else []
        if rows:   # the last checkpoint's cells, as metrics.tsv writes them
            updates[direction] = {column: "-" if value is None else
                                  f"{value:.6g}" if isinstance(value, float) else str(value)
                                  for column, value in rows[-1].items()}

    lines = [f"# {args.title or 'AER of ' + os.path.basename(args.model_dir.rstrip('/'))}", ""]
    lines += ["AER in % (lower is better), word level, source–target; "
              "symmetrized columns combine the fwd and rev links.", ""]
    for name in sets:
        lines += [f"## {name} ({sizes[name]} pairs)", ""]
        head = "| method | " + " | ".join(columns) + " | " + \
            f"P / R ({columns[-1]}) |"
        lines += [head, "|" + "---|" * (len(columns) + 2)]
        for label, _, _ in methods:
            cells = [f"{100 * results[(name, label, c)].aer:.1f}" for c in columns]
            last = results[(name, label, columns[-1])]
            lines.append(f"| {label} | " + " | ".join(cells) +
                         f" | {100 * last.precision:.1f} / {100 * last.recall:.1f} |")
        lines.append("")
    lines += ["## Set-up", ""]
    lines.append(f"- model directory: `{args.model_dir}` ({config.model_kind}, checkpoint "
                 f"`{args.checkpoint}`), model: " + ", ".join(
                     f"{k}={v}" for k, v in sorted(config.models[config.directions[0]].items())))
    lines.append("- preprocessing: " + ", ".join(f"{k}={v}" for k, v in sorted(
        config.prep.items())))
    training = config.training.to_dict()
    lines.append("- training: " + ", ".join(f"{k}={v}" for k, v in sorted(training.items())))
    if corpus_stats:
        lines.append(f"- training corpus: {corpus_stats}")
    for direction, row in updates.items():
        lines.append(f"- {direction}: {row.get('update')} updates, {row.get('epoch')} epochs, "
                     f"train loss {row.get('train_loss')}, {row.get('tokens_per_s')} target "
                     f"tokens/s (last run), {row.get('elapsed_s')} s training")
    if train_seconds is not None:
        lines.append(f"- wall time of `align train`: {train_seconds:.0f} s")
    lines.append("- extraction wall time: " + ", ".join(f"{k} {v:.1f} s"
                                                         for k, v in timings.items()))
    lines.append(f"- device: {device}, torch threads: {torch.get_num_threads()}, cores: "
                 f"{os.cpu_count()}, load average at the end: "
                 f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    lines += ["", "## Commands", "", "```"]
    if train_command is not None:
        lines.append(" ".join(shlex.quote(a) for a in train_command))
    lines.append(command_line)
    lines += ["```", ""]
    report = "\n".join(lines)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(report, encoding="utf-8")
    tsv = Path(args.output).with_suffix(".tsv")
    with open(tsv, "w", encoding="utf-8") as out:
        out.write("set\tmethod\tcolumn\taer\tprecision\trecall\tf1\tn_hyp\tn_sure\tn_possible\n")
        for (name, label, column), score in results.items():
            out.write(f"{name}\t{label}\t{column}\t{score.aer:.6f}\t{score.precision:.6f}\t"
                      f"{score.recall:.6f}\t{score.f1:.6f}\t{score.n_hyp}\t{score.n_sure}\t"
                      f"{score.n_possible}\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
