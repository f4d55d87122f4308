"""`align demo`: the main job on the shipped sample, with no arguments, in a few minutes on CPU.

Trains the recipe's job at the sample's size (aligner/training/recipe.py: its teacher and
self-training rounds, with a smaller model, DEMO_MODEL_OPTIONS and DEMO_TRAINING) in both
directions on data/sample (train + trial pairs, the trial set appended as in the benchmark
set-up; on a CPU with two or more cores the directions of 1,000+ pairs train at the same time,
one thread each), extracts the trial alignments with the HMM methods, symmetrizes them and
prints an AER table against the trial gold. The job is made by aligner.training.builder, as
align train's and align run's.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import click

from aligner import constants as C
from aligner.cli.options import (bpe_merges_option, device_option, max_epochs_option,
                                 not_empty, quiet_option, recipe_summary, seed_option,
                                 threads_option)
from aligner.cli.train import set_threads
from aligner.training import recipe
from aligner.utils import check_condition

#: the shipped sample (data/sample beside the package in a source checkout)
DEFAULT_SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample"
SAMPLE_FILES = ("train.en", "train.fr", "trial.en", "trial.fr", "trial.talp")

#: minutes per epoch of the 3,037-pair sample on 2 idle cores, the teacher and the guides'
#: alignment included (eval/results/demo_sample.md)
MINUTES_PER_EPOCH = 0.5
DEMO_METHODS = ("hmm-posterior", "hmm-viterbi")
#: the Moses heuristic the seeds report, and the posterior average that suits the HMM best
DEMO_HEURISTICS = (C.DEFAULT_HEURISTIC, "intersect", "soft-average")


def aer_table(rows: List[List[str]]) -> str:
    """Markdown table: method | fwd | rev | heuristics..., cells already formatted."""
    header = ["method", "fwd", "rev", *DEMO_HEURISTICS]
    widths = [max(len(r[k]) for r in rows + [header]) for k in range(len(header))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)


#: `align demo --help`: what the demo trains, from the recipe's values
HELP = f"""Train on the shipped sample, align the trial set and print its AER table.

The recipe's job at the sample's size: {recipe_summary("--max-epochs epochs", flags=False,
                                                       mixed=False)};
with a smaller model ({", ".join(f"{key} {value}" for key, value in
recipe.DEMO_MODEL_OPTIONS.items())}) and batches of {recipe.DEMO_TRAINING["max_tokens"]} tokens
at lr {recipe.DEMO_TRAINING["lr"]:g}. Equivalent to: align train -s train+trial.en -t train+trial.fr with
those settings; align extract --mix-weight 0 (the network alone) --uncalibrated --method
hmm-posterior / hmm-viterbi -H grow-diag / intersect / soft-average --threshold 0.5 on trial;
align score-aer against trial.talp. With -q it prints only the table.
One thread (--threads 1) is the safe choice for this small model: on a busy machine more
threads can be slower (two directions side by side still get one each).
"""


@click.command("demo", help=HELP)
@click.option("--sample-dir", type=click.Path(file_okay=False), default=str(DEFAULT_SAMPLE),
              show_default=True, help="Folder with train.en/.fr and trial.en/.fr/.talp.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              callback=not_empty,
              help="Keep the model directory here (default: a temporary folder, removed).")
@max_epochs_option(recipe.DEMO_EPOCHS, min_epochs=1)
@bpe_merges_option(recipe.DEMO_BPE_MERGES)
@device_option
@seed_option
# one thread is the safe choice for this small model: on a busy machine more threads can be
# slower; two directions side by side still get one each (one_thread_each below)
@threads_option(1)
@quiet_option
def command(sample_dir: str, workdir: Optional[str], max_epochs: int, bpe_merges: int,
            device: str, seed: int, threads: int, quiet: bool) -> None:
    """`align demo` (its help: :data:`HELP`)."""
    from aligner.distributed import resolve_device
    from aligner.extract.inference import extract_all
    from aligner.formats import Bitext, read_bitext, read_gold
    from aligner.links.metrics import score_aer
    from aligner.log import setup_logging
    from aligner.model_dir import LoadedModelDir
    from aligner.training.builder import build_job
    from aligner.training.rounds import train_rounds

    set_threads(threads)
    start = time.time()
    paths = {name: os.path.join(sample_dir, name) for name in SAMPLE_FILES}
    missing = [p for p in paths.values() if not os.path.isfile(p)]
    check_condition(not missing, f"{missing[0] if missing else ''}: sample file missing "
                                 f"(give --sample-dir)")
    train = read_bitext(paths["train.en"], paths["train.fr"])
    trial = read_bitext(paths["trial.en"], paths["trial.fr"])
    gold = read_gold(paths["trial.talp"], n_sentences=len(trial))
    bitext = Bitext(train.source + trial.source, train.target + trial.target,
                    paths["train.en"], paths["train.fr"])
    # round 1's epochs, then each later round's
    epochs = [max_epochs] + [recipe.FINE_TUNE_EPOCHS] * (recipe.ROUNDS - 1)
    schedule = (f"{'the teacher, then ' if recipe.TEACHER else ''}{len(epochs)} self-training "
                f"rounds of {' + '.join(map(str, epochs))} epochs" if len(epochs) > 1
                else f"{max_epochs} epochs")
    if not quiet:   # measured: MINUTES_PER_EPOCH per epoch of the sample, 2 idle cores
        minutes = MINUTES_PER_EPOCH * sum(epochs) * len(bitext) / 3037
        click.echo(f"align demo: training {recipe.MODEL_KIND} on {len(bitext)} pairs, "
                   f"{schedule} per direction: about {max(1, round(minutes))} minute(s) on 2 "
                   f"CPU cores (eval/results/demo_sample.md), then the AER table", err=True)
    temporary = None
    if workdir is None:
        temporary = tempfile.TemporaryDirectory(prefix="align-demo-")
        workdir = temporary.name
    model_dir = os.path.join(workdir, "model")
    # the recipe's job but for the demo's settings; the directions side by side by the rule
    # of align train and align run, where --threads 1 still trains them so
    request, plan = build_job(
        model_dir, bitext, model_options=dict(recipe.DEMO_MODEL_OPTIONS),
        bpe_merges=bpe_merges, max_epochs=max_epochs, training=dict(recipe.DEMO_TRAINING),
        one_thread_each=True, device=device, seed=seed, overwrite=True, quiet=quiet,
        argv=["align", "demo", "--sample-dir", sample_dir],
        epoch_repeats=1)   # the demo's own epochs (DEMO_EPOCHS), measured for its minutes
    setup_logging(quiet=quiet)   # the messages between rounds
    try:
        train_rounds(request, plan)
        loaded = LoadedModelDir.load(model_dir, device=resolve_device(device))
        rows = []
        for method in DEMO_METHODS:
            result = extract_all(loaded, trial, method, heuristics=DEMO_HEURISTICS)
            rows.append([method] + [f"{100 * score_aer(result[key], gold).aer:.1f}"
                                    for key in ("fwd", "rev", *DEMO_HEURISTICS)])
    finally:
        if temporary is not None:
            temporary.cleanup()
    click.echo(f"AER (%) on the {len(trial)} trial pairs of {sample_dir} (lower is better); "
               f"trained on {len(bitext)} pairs, {schedule} per direction, "
               f"{time.time() - start:.0f}s in all")
    click.echo(aer_table(rows))
    if temporary is None:
        click.echo(f"model directory: {model_dir}")
