"""`align run`: align a whole bitext in one command, as eflomal-align or fast_align do.

Trains both directions of the recipe's model (aligner/training/recipe.py) on the bitext itself, in
self-training rounds (aligner.training.rounds; the job made by aligner.training.builder, as
align train's), then writes the symmetrized word alignments of every input line
(aligner.extract.corpus_alignment, block by block: memory does not grow with the corpus, except with
--soft). Only parses options and wires the two; torch is imported inside.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import shutil
import sys
import tempfile
import time
from typing import Optional, Tuple

import click

from aligner import constants as C
from aligner.training import recipe
from aligner.cli.options import (INPUT, FiniteFloat, agreement_weight_option, bitext_options,
                                 join_lines_option, lowercase_option, shortlist_option,
                                 subword_pooling_option,
                                 block_lines_option, bpe_merges_option, deterministic_option,
                                 processes_option,
                                 device_option, guide_options, lr_option, max_tokens_option,
                                 max_updates_option, model_dir_option, model_option_option,
                                 overwrite_option, precision_option, quiet_option,
                                 recipe_summary, resume_option, rounds_option, seed_option,
                                 self_training_options, threads_option, warmup_option,
                                 RUN_KINDS, model_kind_option)
from aligner.cli.train import check_bitext_args, check_gold_in_range, parse_key_values, set_threads
from aligner.links.soft_symmetrize import DEFAULT_THRESHOLD
from aligner.utils import (AlignerError, Terminated, check_condition, check_distinct_files,
                           check_outside_model_dir, check_writable, sigterm_raises)

logger = logging.getLogger(__name__)

#: `align run --help`: what the command trains, from the recipe's values
HELP = f"""Train on a bitext and write the word alignments of every one of its lines.

Example: align run -s corpus.en -t corpus.fr -o corpus.align

The model is the recipe of aligner/training/recipe.py: {recipe_summary()}. Exactly one
output line per input line, in input order; a line with an empty side, or too long for the
model, gets an empty line (and a warning). The final alignment keeps each finished block of
--block-lines lines in MODEL_DIR/alignment.parts until the outputs are written: --resume
after a cut-off run goes on from the first unfinished block (not with --soft, which holds
every matrix in memory). On a CPU with 2+ cores and 2+ --threads, the two directions of a
bitext of 1,000+ pairs train at the same time, each with half of the threads.
"""


@click.command("run", help=HELP)
@bitext_options
@model_kind_option(RUN_KINDS)
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default="-",
              show_default=True,
              help="Symmetrized Pharaoh alignments, one line per input line ('-' = stdout).")
@click.option("-f", "--forward-links", "forward_links", type=click.Path(dir_okay=False),
              default=None, help="Also write the fwd direction's links (source-target) here.")
@click.option("-r", "--reverse-links", "reverse_links", type=click.Path(dir_okay=False),
              default=None, help="Also write the rev direction's links (source-target) here.")
@click.option("--soft", type=click.Path(dir_okay=False), default=None,
              help="Also write the soft alignment matrices (.npz, as align extract --soft).")
@click.option("-H", "--symmetrize", "heuristic",
              type=click.Choice(list(C.HEURISTICS + C.SOFT_HEURISTICS)),
              default=recipe.HEURISTIC, show_default=True, help="How to combine the directions.")
@click.option("--threshold", type=FiniteFloat(0.0, 1.0, max_open=True), default=None,
              help=f"Probability threshold of -H soft-average for the output (recorded in the "
                   f"model directory as align extract's default); after self-training rounds "
                   f"the threshold of lines under 15 words, lower for longer lines as the "
                   f"model's posteriors spread (calibrated on the bitext); the teacher's "
                   f"share of the output is judged at its own, scaled by as much  [default: "
                   f"{recipe.THRESHOLD} after self-training rounds, {DEFAULT_THRESHOLD} with "
                   f"--rounds 1]")
@shortlist_option
@subword_pooling_option
@model_dir_option(required=False, default_help="a temporary directory, removed at the end")
@overwrite_option
@resume_option
@click.option("-g", "--gold", type=INPUT, default=None,
              help="Gold alignments (talp) of some of the lines: print the AER table.")
@click.option("--gold-first-line", type=click.IntRange(min=1), default=None,
              help="Input line (1-based) of the gold's first line [default: the gold covers "
                   "the last lines, the usual benchmark set-up with the test set appended].")
@guide_options
@rounds_option(recipe.ROUNDS)
@self_training_options
@agreement_weight_option
@join_lines_option
# not --max-epochs (aligner.cli.options.max_epochs_option says why)
@click.option("--epochs", default=recipe.EPOCHS_PER_ROUND, show_default=True,
              type=click.IntRange(min=1),
              help=f"Training passes over the bitext per direction in round 1 (and in every "
                   f"round with --afresh); on a round of fewer than {recipe.ROUND_MIN_PAIRS:,} "
                   f"lines each pass is repeated ceil({recipe.ROUND_MIN_PAIRS:,} / lines) "
                   f"times (at most {recipe.ROUND_MAX_REPEATS}), as are --fine-tune-epochs; --max-updates, if given, replaces it.")
@max_updates_option
@lowercase_option()
@bpe_merges_option()
@click.option("--max-len", default=None, type=click.IntRange(min=1),
              help=f"Skip training pairs with a side longer than this (subwords).  [default: "
                   f"{recipe.TRAIN_MAX_LEN}, or what -M max_positions allows]")
@model_option_option
@max_tokens_option
@block_lines_option
@processes_option
@lr_option
@warmup_option
@device_option
@precision_option
@deterministic_option
@seed_option
@threads_option()
@quiet_option
def command(source: Optional[str], target: Optional[str], joint: Optional[str],
            model_kind: str, output: str, forward_links: Optional[str],
            reverse_links: Optional[str], soft: Optional[str],
            heuristic: str, threshold: Optional[float], self_guide_threshold: float,
            self_guide_mix_weight: float,
            shortlist: int, subword_pooling: str, model_dir: Optional[str], overwrite: bool,
            resume: bool,
            gold: Optional[str], gold_first_line: Optional[int], guide: Optional[str],
            guide_weight: Optional[float], rounds: int, self_guide_weight: float,
            fine_tune: bool, agreement_weight: float, join_lines: Optional[int], epochs: int,
            fine_tune_epochs: int,
            fine_tune_lr_schedule: str, round_pairs: int,
            fine_tune_share: float, final_agreement_weight: Optional[float], teacher: bool,
            max_updates: int,
            lowercase: Optional[bool], bpe_merges: Optional[int], max_len: Optional[int],
            model_option: Tuple[str, ...],
            max_tokens: Optional[int], block_lines: Optional[int], processes: int,
            lr: Optional[float],
            warmup: Optional[int],
            device: str, precision: str, deterministic: bool, seed: int, threads: int,
            quiet: bool) -> None:
    """`align run` (its help: :data:`HELP`)."""
    from aligner.cli.extract import write_results
    from aligner.distributed import distributed, resolve_device, torchrun_world_size
    from aligner.extract.calibrate import calibrated_extraction
    from aligner.extract.corpus_alignment import Extraction, align_bitext, shortlist_options
    from aligner.formats import bitext_blocks, open_bitext, read_bitext, read_gold
    from aligner.links.combine import needs_soft
    from aligner.links.metrics import score_aer
    from aligner.log import setup_logging
    from aligner.precision import resolve_precision
    from aligner.training.builder import build_job
    from aligner.training.loop import use_deterministic_algorithms
    from aligner.training.rounds import train_rounds

    use_deterministic_algorithms(deterministic)   # before anything starts CUDA
    logger = setup_logging(quiet=quiet)
    set_threads(threads)
    check_bitext_args(source, target, joint, "the bitext")
    check_condition(not resume or model_dir is not None,
                    "--resume continues the run in --model-dir: give it (without --model-dir "
                    "the model is in a temporary directory, removed at the end)")
    check_condition(soft != "-", "--soft -: the .npz matrices cannot go to stdout; give a "
                                 "file name")
    outputs = {"-o": output, "-f": forward_links, "-r": reverse_links, "--soft": soft}
    check_distinct_files({"-s": source, "-t": target, "-i": joint, "-g": gold,
                          "--guide": guide}, outputs)
    check_outside_model_dir(model_dir, outputs)
    for option, path in outputs.items():
        check_writable(path, option)
    # --soft keeps every matrix: the bitext in memory; otherwise it is read at every pass
    bitext = read_bitext(source, target, joint) if soft else open_bitext(source, target, joint)
    n_lines = len(bitext)
    golds, gold_lines = None, range(0)
    if gold is not None:
        golds = read_gold(gold)
        gold_start = (gold_first_line - 1 if gold_first_line is not None
                      else n_lines - len(golds))
        check_condition(0 <= gold_start and gold_start + len(golds) <= n_lines,
                        f"{gold}: {len(golds)} lines do not fit the {n_lines} input lines "
                        f"from line {gold_start + 1} on")
        gold_lines = range(gold_start, gold_start + len(golds))
        gold_bitext = next(bitext_blocks(itertools.islice(bitext, gold_start, gold_lines.stop),
                                         len(golds), bitext.source_name, bitext.target_name))
        check_gold_in_range(golds, gold, "talp", gold_bitext)
    usable = sum(1 for s, t in bitext if s and t)
    check_condition(usable > 0, f"{bitext.source_name}: no line has both sides: nothing to "
                                f"train on")
    check_condition(model_dir is not None or torchrun_world_size() == 1,
                    "under torchrun give --model-dir (on a file system every rank reads): "
                    "each process would make a temporary directory of its own")
    classical = model_kind != recipe.MODEL_KIND
    if classical:   # one training: no rounds unless asked for (then refused, in one line)
        if click.get_current_context().get_parameter_source(
                "rounds") is click.core.ParameterSource.DEFAULT:
            rounds = 1
        shortlist = 0   # no softmax over a vocabulary to shorten
    # everything is checked before a temporary model directory is made
    request, plan = build_job(
        model_dir or "", bitext, model_kind=model_kind,
        model_options=parse_key_values(model_option, "--model-option"),
        prep_options=dict(lowercase=lowercase),
        bpe_merges=bpe_merges, max_len=max_len, guide=guide, guide_weight=guide_weight,
        max_tokens=max_tokens, lr=lr, warmup=warmup,
        # --epochs: a round's length, which --max-updates replaces
        max_epochs=0 if max_updates else epochs, max_updates=max_updates,
        agreement_weight=agreement_weight, rounds=rounds,
        join_lines=join_lines,
        self_training=dict(guide_weight=self_guide_weight,
                           guide_threshold=self_guide_threshold,
                           guide_mix_weight=self_guide_mix_weight, heuristic=heuristic,
                           fine_tune=fine_tune, fine_tune_epochs=fine_tune_epochs,
                           fine_tune_lr_schedule=fine_tune_lr_schedule,
                           shortlist=recipe.GUIDE_SHORTLIST,
                           round_pairs=round_pairs, fine_tune_share=fine_tune_share,
                           teacher=teacher, block_lines=block_lines or 0),
        threshold=threshold, final_agreement_weight=final_agreement_weight,
        record_output=True, device=device, precision=precision, deterministic=deterministic,
        seed=seed, resume=resume, overwrite=overwrite, quiet=quiet,
        argv=["align"] + sys.argv[1:])
    threshold = plan.output_threshold
    if classical:
        logger.info("align run: %d sentence pairs, the classical aligner (-H %s)", n_lines,
                    heuristic)
    else:
        logger.info("align run: %d sentence pairs, %s recipe (%s, -H %s), %d BPE merges, %s",
                    n_lines, recipe.MODEL_KIND, recipe.METHOD, heuristic,
                    request.prep_config.bpe_merges,
                    f"{max_updates} updates" if max_updates else f"{epochs} epochs")
    temporary = None
    # SIGTERM (`kill`, `timeout`, a scheduler) as Ctrl-C: the worker processes (the teacher's,
    # the directions', the alignment's) are stopped and the temporary directory is removed
    stack = contextlib.ExitStack()
    stack.enter_context(sigterm_raises())
    kept = model_dir is not None   # else in a temporary directory, removed at the end
    try:
        if not kept:
            temporary = tempfile.mkdtemp(prefix="align-run-")
            model_dir = os.path.join(temporary, "model")
            request = dataclasses.replace(request, model_dir=model_dir)
        # under torchrun one process group for the rounds and the final alignment (its
        # blocks sharded over the ranks, aligner/extract/blocks.py)
        with distributed(device) as context:
            reports = context.is_main   # torchrun: rank 0 writes the outputs and reports
            trained = train_rounds(request, plan)
            aligning = time.time()
            parts = os.path.join(model_dir, C.ALIGNMENT_PARTS)
            extraction = Extraction.load(
                model_dir, resolve_device(device, context.local_rank,
                                          context.local_world_size),
                recipe.METHOD, heuristic, threshold, shortlist_options(shortlist),
                pooling=subword_pooling)
            # auto: bf16 on a CPU with bfloat16 instructions too (training: fp32)
            inference_precision = resolve_precision(precision, extraction.device,
                                                    inference=True)
            if plan.rounds > 1 and needs_soft(heuristic):   # per line length (calibrate.py)
                extraction = calibrated_extraction(extraction, bitext, seed,
                                                   inference_precision, write=context.is_main)
            gold_rows, matrices, links = align_bitext(
                extraction, bitext,
                {heuristic: output, "fwd": forward_links, "rev": reverse_links},
                gold_lines=gold_lines, keep_soft=soft is not None, quiet=quiet,
                precision=inference_precision,
                # the finished blocks, kept until the outputs are written: --resume goes on
                # from the first unfinished one (a run without --resume starts in a model
                # directory of its own, where such a folder can only be stale)
                parts=parts, resume=resume, overwrite=not resume, block_lines=block_lines,
                processes=processes,
                anew=f"remove {parts} to align anew")
            if matrices is not None:
                write_results(output, matrices.pop("alignments"), soft, matrices)
            seconds = {"training": trained.training_seconds,
                       "alignment": trained.alignment_seconds + time.time() - aligning}
    except (KeyboardInterrupt, Terminated) as stop:
        raise AlignerError(("interrupted; " if isinstance(stop, KeyboardInterrupt)
                            else "terminated (SIGTERM); ") + (
            f"continue with the same command plus --resume (the run is in {model_dir})"
            if kept else "the model was in a temporary directory, now removed "
            "(give --model-dir to be able to resume)")) from None
    finally:
        try:
            if temporary is not None:
                shutil.rmtree(temporary, ignore_errors=True)
        finally:
            stack.close()
    if not reports:
        return   # torchrun: rank 0 wrote the outputs (aligner/extract/blocks.py) and reports
    click.echo(f"align run: {n_lines} sentence pairs, {links} links "
               f"({links / max(1, n_lines):.1f} per pair); training {seconds['training']:.0f}s, "
               f"alignment {seconds['alignment']:.0f}s"
               + (f" ({rounds} self-training rounds)" if rounds > 1 else "")
               + ("" if temporary is not None else f"; model in {model_dir}"), err=True)
    if golds is not None:
        click.echo(f"AER (%) on input lines {gold_lines.start + 1}-{gold_lines.stop} "
                   f"against {gold}:", err=True)
        click.echo("| alignment | AER | precision | recall |", err=True)
        click.echo("|---|---|---|---|", err=True)
        for name in ("fwd", "rev", heuristic):
            score = score_aer(gold_rows[name], golds)
            click.echo(f"| {name} | {100 * score.aer:.1f} | {100 * score.precision:.1f} | "
                       f"{100 * score.recall:.1f} |", err=True)

