"""`align demo`: the main job on the shipped sample, with no arguments, in a few minutes on CPU.

Trains a small first-order direct HMM (hmm1) in both directions on data/sample (train + trial
pairs, the trial set appended as in the benchmark set-up; on a CPU with two or more cores the
directions of 1,000+ pairs train at the same time, one thread each), extracts the trial alignments with the HMM methods,
symmetrizes them and prints an AER table against the trial gold.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import click

from aligner import constants as C
from aligner.config import CHECKPOINT_AT_THE_END
from aligner.training import recipe
from aligner.cli.options import (bpe_merges_option, device_option,
                                 max_epochs_option, not_empty, quiet_option, seed_option,
                                 threads_option)
from aligner.cli.train import set_threads
from aligner.utils import check_condition

#: the shipped sample (data/sample beside the package in a source checkout)
DEFAULT_SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample"
SAMPLE_FILES = ("train.en", "train.fr", "trial.en", "trial.fr", "trial.talp")

#: the demo model: the kind with the best alignments (eval/results), small enough for a few
#: minutes on 2 CPU cores
DEMO_KIND = "hmm1"
DEMO_MODEL = dict(d_model=64, n_heads=4, enc_layers=2, dec_layers=2, d_ff=256, dropout=0.0,
                  max_positions=256, tie_embeddings=True,
                  lexicon_activation=recipe.MODEL_OPTIONS["lexicon_activation"])
#: small batches and a high learning rate: the most progress per CPU second on 3,000 pairs
#: (chosen for the transformer demo: its fwd attention's trial AER fell fastest with these)
DEMO_TRAINING = dict(max_tokens=800, lr=5e-3, warmup=100, label_smoothing=0.0)
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


@click.command("demo")
@click.option("--sample-dir", type=click.Path(file_okay=False), default=str(DEFAULT_SAMPLE),
              show_default=True, help="Folder with train.en/.fr and trial.en/.fr/.talp.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              callback=not_empty,
              help="Keep the model directory here (default: a temporary folder, removed).")
@max_epochs_option(3, min_epochs=1)
@bpe_merges_option(1000)
@device_option
@seed_option
# one thread is the safe choice for this small model: on a busy machine more threads can be
# slower; two directions side by side still get one each (one_thread_each below)
@threads_option(1)
@quiet_option
def command(sample_dir: str, workdir: Optional[str], max_epochs: int, bpe_merges: int,
            device: str, seed: int, threads: int, quiet: bool) -> None:
    """Train on the shipped sample, align the trial set and print its AER table.

    Equivalent to: align train -s train+trial.en -t train+trial.fr --model hmm1 (small model,
    --parallel-directions on a multi-core CPU); align extract --method hmm-posterior /
    hmm-viterbi -H grow-diag / intersect / soft-average on trial; align score-aer against
    trial.talp. With -q it prints only the table. One thread (--threads 1) is the safe
    choice for this small model: on a busy machine more threads can be slower.
    """
    from aligner.config import DataConfig, TrainConfig
    from aligner.distributed import resolve_device
    from aligner.formats import Bitext, read_bitext, read_gold
    from aligner.inference import extract_all
    from aligner.metrics import score_aer
    from aligner.model_dir import LoadedModelDir
    from aligner.prep import PrepConfig
    from aligner.training import directions, run

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
    if not quiet:   # measured: 1 min 36 s for 3 epochs of the 3,037-pair sample, 2 idle cores
        minutes = 0.53 * max_epochs * len(bitext) / 3037
        click.echo(f"align demo: training hmm1 on {len(bitext)} pairs, {max_epochs} epochs per "
                   f"direction: about {max(1, round(minutes))} minute(s) on 2 CPU cores "
                   f"(eval/results/demo_sample.md), then the AER table", err=True)
    temporary = None
    if workdir is None:
        temporary = tempfile.TemporaryDirectory(prefix="align-demo-")
        workdir = temporary.name
    model_dir = os.path.join(workdir, "model")
    train_config = TrainConfig(**DEMO_TRAINING, max_epochs=max_epochs,
                               checkpoint_interval=CHECKPOINT_AT_THE_END, device=device,
                               seed=seed)
    # the rule of align train and align run, where --threads 1 still trains side by side
    parallel = directions.default_parallel_directions(
        resolve_device(device), C.DIRECTIONS, 0.0, len(bitext), one_thread_each=True)
    try:
        run.train(run.TrainRequest(
            model_dir, bitext, DEMO_KIND, dict(DEMO_MODEL), PrepConfig(bpe_merges=bpe_merges),
            DataConfig(max_len=recipe.TRAIN_MAX_LEN),   # align train's for the recipe's kind
            train_config, overwrite=True, quiet=quiet,
            argv=["align", "demo", "--sample-dir", sample_dir], parallel_directions=parallel))
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
               f"trained on {len(bitext)} pairs, {max_epochs} epochs per direction, "
               f"{time.time() - start:.0f}s in all")
    click.echo(aer_table(rows))
    if temporary is None:
        click.echo(f"model directory: {model_dir}")
