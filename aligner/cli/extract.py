"""`align extract`: word alignments of sentence pairs from a trained model directory.

Only parses options, resolves the extraction (aligner.extract.corpus_alignment.Extraction) and
writes the result; the work is aligner.extract.corpus_alignment's, the path every whole-bitext
alignment takes (aligner/extract/streaming.py for a pipe). torch is imported inside the command
function.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence, Tuple

import click

from aligner import constants as C
from aligner.training import recipe
from aligner.cli.options import (block_lines_option, checkpoint_option, device_option,
                                 inference_precision_option, processes_option, quiet_option,
                                 extract_subword_pooling_option, threads_option)
from aligner.cli.train import FiniteFloat, bitext_options, check_bitext_args, set_threads
from aligner.utils import (AlignerError, check_condition, check_distinct_files,
                           check_outside_model_dir, check_writable)

#: types of the method options: the same as the dedicated options (--layer, --sgd-steps,
#: --sgd-lr, --init); ``seed`` is the random start of ``layer-sgd --init random``
LAYER = click.INT
SGD_STEPS = click.IntRange(min=0)
SGD_LR = FiniteFloat()
INIT = click.Choice(["forward", "random"])
METHOD_OPTION_TYPES: Dict[str, click.ParamType] = {
    "layer": LAYER, "sgd_steps": SGD_STEPS, "sgd_lr": SGD_LR, "init": INIT, "seed": click.INT,
    # hmm-posterior / hmm-viterbi: normalize the lexicon over the N most frequent words (and
    # the sentence's) instead of the vocabulary: faster, approximate (0 = exact)
    "shortlist": click.IntRange(min=0)}


def method_options(pairs: Sequence[str], option: str = "-O") -> Dict[str, Any]:
    """-O KEY=VALUE strings -> dict of typed method options, validated before any work.

    Keys are those of METHOD_OPTION_TYPES (``-`` may stand for ``_``); each VALUE is read as
    its key's type, exactly as the dedicated option reads it (``-O layer=2`` as ``--layer
    2``). A malformed pair, an unknown key or a value of the wrong type raises AlignerError
    naming the option. Whether the chosen method takes a key is the method's own check.
    """
    options = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        check_condition(bool(sep) and bool(key), f"{option} expects KEY=VALUE, got '{pair}'")
        check_condition(key in METHOD_OPTION_TYPES,
                        f"{option} {pair}: unknown method option '{key}' (known: "
                        f"{', '.join(sorted(METHOD_OPTION_TYPES))})")
        try:
            options[key] = METHOD_OPTION_TYPES[key].convert(raw.strip(), None, None)
        except click.BadParameter as error:
            raise AlignerError(f"{option} {pair}: {error.message}") from None
    return options


#: every kind's methods for --help, first = default (tests check it against the registry;
#: written out so that `align extract -h` need not import torch)
METHODS_HELP = ("transformer: attention, attention-avg; alignment-layer: layer-sgd, layer, "
                "attention, attention-avg; hmm0: hmm-posterior, hmm-alignment; hmm1: "
                "hmm-posterior, hmm-viterbi, hmm-alignment; classical: hmm-posterior")


@click.command("extract")
@click.argument("model_dir", type=click.Path(file_okay=False))
@bitext_options
@click.option("-m", "--method", default=None,
              help=f"Extraction method by model kind ({METHODS_HELP}). Default: the model "
                   f"kind's first method (a guided alignment layer's: layer).")
@click.option("--layer", type=LAYER, default=None,
              help="Decoder layer (1-based) for --method attention; default the penultimate.")
@click.option("--sgd-steps", type=SGD_STEPS, default=None,
              help="layer-sgd: gradient steps of the attention optimization  [default: 3]")
@click.option("--sgd-lr", type=SGD_LR, default=None,
              help="layer-sgd: learning rate of the attention optimization  [default: 1.0]")
@click.option("--init", "sgd_init", type=INIT, default=None,
              help="layer-sgd: start from the layer's attention or uniform random weights  "
                   "[default: forward]")
@click.option("-O", "--method-option", "method_option", multiple=True, metavar="KEY=VALUE",
              help="Further option of the method (repeatable), e.g. -O sgd_steps=3; keys: "
                   + ", ".join(sorted(METHOD_OPTION_TYPES)) + f". shortlist=N (hmm-posterior, "
                   f"hmm-viterbi): the lexicon normalized over the N most frequent target "
                   f"subwords and the sentence's own [default: {recipe.SHORTLIST}; 0 = exact].")
@click.option("--direction", type=click.Choice(["fwd", "rev", "both"]), default="both",
              show_default=True, help="fwd = p(target|source), rev = p(source|target), both = "
                                      "symmetrized. Output is always source-target.")
@click.option("-H", "--symmetrize", "heuristic",
              type=click.Choice(list(C.HEURISTICS + C.SOFT_HEURISTICS)), default=None,
              help=f"Heuristic for --direction both [default: the one recorded by align run "
                   f"or a self-training align train, for their model directories; else the "
                   f"model kind's best: soft-average for hmm0/hmm1, {C.DEFAULT_HEURISTIC} for "
                   f"the others]. The Moses "
                   f"heuristics combine the two directions' links; soft-average links (i, j) "
                   f"when the mean of the two directions' word-level probabilities (as "
                   f"written by --soft) exceeds --threshold.")
@click.option("--threshold", type=FiniteFloat(0.0, 1.0, max_open=True), default=None,
              help="Probability threshold of -H soft-average  [default: the one recorded by "
                   "align run or a self-training align train (0.55 for the recipe), for their "
                   "model directories; else 0.5]. For a model calibrated on its bitext (the "
                   "recipe's), the threshold of lines under 15 words: longer lines get it "
                   "scaled down as the model's posteriors spread with length. With a mixture "
                   "(--mix) it is this model's share's, and scales OTHER's by as much.")
@click.option("--calibrated/--uncalibrated", default=True, show_default=True,
              help="Scale the threshold per line length by the model directory's "
                   "calibration (calibration.json, written by align run and a self-training "
                   "align train), or keep one threshold for every line.")
@click.option("--mix", "mix_dir", type=click.Path(file_okay=False), default=None,
              metavar="OTHER_MODEL_DIR",
              help="Mix another model directory's posteriors into this model's before the "
                   "directions are combined (-H soft-average, both directions): each "
                   "direction's word-level matrix becomes (1 - W) * this model's + W * "
                   "OTHER's, and a line's threshold (1 - W) * this model's + W * OTHER's "
                   "(the one OTHER records, else 0.5; scaled as a given --threshold is) "
                   "[default: the recipe's own classical teacher, MODEL_DIR/rounds/0, "
                   "for a model directory of align run or a self-training align train]. "
                   "OTHER: e.g. the classical aligner trained on the same bitext (align train "
                   "--model classical), or another seed of the recipe.")
@click.option("--mix-weight", type=FiniteFloat(0.0, 1.0), default=None,
              help=f"W of the mixture; 0: this model's own posteriors alone  [default: the "
                   f"one the model directory records, {recipe.MIX_WEIGHT} for the recipe; "
                   f"{recipe.MIX_WEIGHT} with --mix]")
@click.option("--mix-length", type=click.IntRange(min=0), default=None, metavar="WORDS",
              help="Lines longer than this many words (their longer side) give OTHER more "
                   "weight, growing from W to 1 at twice the length: a network aligns lines "
                   "far longer than its training lines poorly; 0: W on every line  [default: "
                   "the one the model directory records: for the recipe the 99th percentile "
                   "of its bitext's line lengths; else 0]")
@click.option("--mix-threshold", type=FiniteFloat(0.0, 1.0, max_open=True), default=None,
              help=f"The threshold OTHER's share of a line is judged at (scaled as a given "
                   f"--threshold is)  [default: the one OTHER records, else 0.5; the recipe's "
                   f"teacher: {recipe.TEACHER_MIX_THRESHOLD}]")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default="-",
              show_default=True, help="Pharaoh output (written atomically); '-' = stdout.")
@click.option("--soft", type=click.Path(dir_okay=False), default=None,
              help="Also write word-level soft alignment matrices to this .npz file (arrays "
                   "'fwd_K' / 'rev_K' of shape (source words, target words) for input line K, "
                   "0-based; no elements for a line that gets no alignment). Written "
                   "together with -o: a failed run writes neither.")
@click.option("--link-probs", type=click.Path(dir_okay=False), default=None,
              help="Also write each link's probability to this file: one line per Pharaoh "
                   "line, one number per link in the same order (as awesome-align's "
                   "--output_prob_file). The number: (p_fwd + p_rev) / 2 for -H "
                   "soft-average, 'p_fwd,p_rev' for a Moses heuristic, the direction's own "
                   "with --direction fwd/rev (word-level, the values of --soft).")
@click.option("--inline-probs", is_flag=True,
              help="Write each link as i-j:p in the Pharaoh output itself (the numbers of "
                   "--link-probs; align score-aer reads it). Streams to stdout with -o -.")
@click.option("--stream-wait", type=click.FloatRange(0.0, 1.0), default=0.05,
              show_default=True,
              help="Input from a pipe or terminal: the longest wait, in seconds, after a "
                   "batch's first pair for more pairs to join it (0: align what has "
                   "arrived at once).")
@extract_subword_pooling_option
@block_lines_option
@processes_option
@click.option("--resume", is_flag=True,
              help="Go on with the alignment that a cut-off run of this command left beside "
                   "-o FILE (FILE.parts: its finished blocks; the same model, input and "
                   "settings) from its first unfinished block.")
@click.option("--overwrite", is_flag=True,
              help="Remove the parts folder a cut-off run of this command left beside -o "
                   "FILE (FILE.parts) and align anew.")
@checkpoint_option
@click.option("--max-tokens", default=None, type=click.IntRange(min=1),
              help="Padded tokens per batch (pairs are batched by length, order restored) "
                   "[default: 500 on a CPU, where small batches are faster (the classical "
                   "aligner: 8000); 4000 on a GPU].")
@device_option
@inference_precision_option
@threads_option()
@quiet_option
def command(model_dir: str, source: Optional[str], target: Optional[str], joint: Optional[str],
            method: Optional[str], layer: Optional[int], sgd_steps: Optional[int],
            sgd_lr: Optional[float], sgd_init: Optional[str], method_option: Tuple[str, ...],
            direction: str, heuristic: Optional[str], threshold: Optional[float],
            calibrated: bool, mix_dir: Optional[str], mix_weight: Optional[float],
            mix_length: Optional[int], mix_threshold: Optional[float], output: str,
            soft: Optional[str], link_probs: Optional[str], inline_probs: bool,
            stream_wait: float, subword_pooling: Optional[str], block_lines: Optional[int],
            processes: int, resume: bool, overwrite: bool,
            checkpoint: str, max_tokens: Optional[int], device: str, precision: str,
            threads: int, quiet: bool) -> None:
    """Align the sentence pairs of -s/-t (or -i) with the model in MODEL_DIR.

    Writes one Pharaoh line (0-based source-target word links "i-j") per input line, in input
    order; a line with an empty side, or too long for the model, gets an empty line and a
    warning. Input is tokenized text (the model applies its own BPE, and its tokenizer when it
    was trained with --tokenize). Options and outputs are checked before the model is loaded;
    -o and --soft are written only when everything is computed. A corpus is read and aligned
    in blocks of 10,000 lines (--block-lines), so memory does not grow with it (except with
    --soft, whose file holds every matrix). With -o FILE each finished block is kept in
    FILE.parts until FILE is written: a run cut off goes on from its first unfinished block
    with --resume.

    Under torchrun (torchrun --nproc_per_node N -m aligner extract ... -o FILE) the N
    processes share the blocks out and rank 0 writes FILE, the same file as one process.

    Streaming: when an input is a pipe or a terminal (-i -, or -s/-t from pipes), pairs are
    aligned as they arrive: a batch takes the pairs that came within 50 ms (--stream-wait)
    of its first one, and its lines are written and flushed at once, so `align extract MODEL
    -i - -o -` serves a process that sends one pair and waits for its alignment. It ends at
    the end of the input, and quietly when the reader goes away (a closed pipe).
    """
    import time

    from aligner.distributed import distributed, resolve_device, torchrun_world_size
    from aligner.extract import streaming
    from aligner.extract.blocks import parts_folder
    from aligner.extract.corpus_alignment import PROBS, Extraction, align_bitext
    from aligner.extract.inference import default_options
    from aligner.extract.mixture import resolve_mixture
    from aligner.extract.link_probs import output_lines
    from aligner.extract.streaming import stream_extract
    from aligner.formats import open_bitext, read_bitext
    from aligner.links.combine import needs_soft
    from aligner.log import setup_logging
    from aligner.model_dir import LoadedModelDir
    from aligner.precision import autocast_context, resolve_precision

    ranks = torchrun_world_size()
    is_main = ranks == 1 or int(os.environ.get("RANK", "0")) == 0
    logger = setup_logging(quiet=quiet or not is_main)
    set_threads(threads)
    check_bitext_args(source, target, joint, "the sentence pairs")
    check_condition(heuristic is None or direction == "both",
                    "--symmetrize combines two directions: use it with --direction both")
    check_condition(threshold is None or heuristic is None or needs_soft(heuristic),
                    "--threshold is the threshold of -H soft-average: give both")
    check_condition(soft != "-", "--soft -: the .npz matrices cannot go to stdout; give a "
                                 "file name")
    check_condition(link_probs != "-", "--link-probs -: give a file name (--inline-probs "
                                       "writes i-j:p links to -o, stdout included)")
    check_condition(not (resume and overwrite), "--resume and --overwrite exclude each other")
    # asked for (--mix-weight 0: none)
    mixing = (mix_dir is not None or bool(mix_weight) or bool(mix_length)
              or mix_threshold is not None)
    check_condition(not mixing or direction == "both",
                    "--mix, --mix-weight, --mix-length and --mix-threshold mix both directions' "
                    "posteriors: use them with --direction both")
    check_condition(not mixing or heuristic is None or needs_soft(heuristic),
                    f"--mix, --mix-weight, --mix-length and --mix-threshold mix posteriors, "
                    f"which -H {heuristic} does not read: use -H soft-average")
    check_distinct_files({"-s": source, "-t": target, "-i": joint},
                         {"-o": output, "--soft": soft, "--link-probs": link_probs})
    check_outside_model_dir(model_dir, {"-o": output, "--soft": soft,
                                        "--link-probs": link_probs})
    check_writable(output, "-o")
    check_writable(soft, "--soft")
    check_link_probs(link_probs, output, soft)
    options = method_options(method_option)
    if layer is not None:
        options["layer"] = layer
    for key, value in (("sgd_steps", sgd_steps), ("sgd_lr", sgd_lr), ("init", sgd_init)):
        if value is not None:  # layer-sgd options; a method without them rejects them
            options[key] = value
    stream = soft is None and streaming.streams(source, target, joint)
    # the finished blocks of -o FILE, kept until FILE is written (not for --soft, which
    # holds every matrix, nor for streamed input)
    parts = None if stream or soft is not None else parts_folder(output)
    if resume or ranks > 1:
        why = ("reads its input from a pipe or terminal as it comes" if stream
               else "holds every matrix of --soft in memory" if soft is not None
               else "writes to stdout (give -o FILE)" if parts is None else None)
        check_condition(why is None, f"{'--resume' if resume else 'torchrun'}: this "
                                     f"alignment has no blocks to "
                                     f"{'resume from' if resume else 'share out'}: it {why}")
    # --soft keeps every matrix: the bitext in memory; otherwise read block by block
    if not stream:
        bitext = (read_bitext(source, target, joint) if soft
                  else open_bitext(source, target, joint))
    start = time.time()
    with distributed(device) as context:   # torchrun: the ranks share the blocks out
        torch_device = resolve_device(device, context.local_rank, context.local_world_size)
        precision = resolve_precision(precision, torch_device, inference=True)
        directions = C.DIRECTIONS if direction == "both" else (direction,)
        loaded = LoadedModelDir.load(model_dir, directions, checkpoint, torch_device)
        model = next(iter(loaded.models.values()))   # the kind's; both directions share it
        kind_methods = model.METHODS
        method = method or kind_methods[0]
        check_condition(method in kind_methods,
                        f"unknown method '{method}' for model kind "
                        f"'{loaded.config.model_kind}' (choose from {', '.join(kind_methods)})")
        given_threshold = threshold
        heuristic, threshold = loaded.symmetrization(heuristic, threshold,   # recorded, if any
                                                     calibrated)
        check_condition(given_threshold is None or direction != "both"
                        or needs_soft(heuristic),
                        f"--threshold is the threshold of -H soft-average, and this model's "
                        f"default heuristic is {heuristic}: give -H soft-average too")
        # the recipe's shortlist where the method takes one (-O shortlist=0: exact)
        options = default_options(model, method, options)
        check_condition(not mixing or needs_soft(heuristic),
                        f"--mix, --mix-weight, --mix-length and --mix-threshold mix posteriors, "
                        f"and this model's default heuristic is {heuristic}: give -H "
                        f"soft-average too")
        mixture = resolve_mixture(loaded, mix_dir, mix_weight, direction, heuristic,
                                  torch_device, mix_length, mix_threshold)
        extraction = Extraction(loaded, method, direction, heuristic, threshold,
                                torch_device, options, max_tokens, mixture,
                                loaded.subword_pooling(subword_pooling))
        with autocast_context(precision, torch_device):
            if stream:   # pairs as they arrive, each batch written and flushed at once
                n_pairs, n_links = stream_extract(extraction, source, target, joint, output,
                                                  link_probs, inline_probs, stream_wait)
            else:   # block by block (the output grows, memory does not); --soft: one block
                _, kept, n_links = align_bitext(
                    extraction, bitext, {extraction.main: output, PROBS: link_probs},
                    inline_probs=inline_probs, keep_soft=soft is not None, quiet=quiet,
                    precision=precision, parts=parts, resume=resume, overwrite=overwrite,
                    block_lines=block_lines, checkpoint=checkpoint, processes=processes)
                n_pairs = len(bitext)
                if kept is not None:   # the .npz holds every matrix: written with -o
                    alignments = kept.pop("alignments")
                    lines = numbers = None
                    if link_probs is not None or inline_probs:
                        by_direction = {d: [kept[f"{d}_{k}"] for k in range(n_pairs)]
                                        for d in extraction.directions}
                        lines, numbers = output_lines(alignments, by_direction, direction,
                                                      heuristic, inline_probs)
                    write_results(output, alignments, soft, kept, lines, link_probs, numbers)
    if is_main:
        logger.info("aligned %d sentence pairs (%s, %s%s, %s): %d links in %.1fs", n_pairs,
                    method, direction,
                    f", {heuristic}" if direction == "both" else "",
                    precision, n_links, time.time() - start)


def check_link_probs(link_probs: Optional[str], output: str, soft: Optional[str]) -> None:
    """--link-probs names a writable file (not -o or --soft: :func:`check_distinct_files`),
    checked before the model is loaded."""
    if link_probs is None:
        return
    check_writable(link_probs, "--link-probs")


def write_results(output: str, alignments, soft: Optional[str],
                  matrices: Optional[Dict[str, Any]], lines: Optional[Sequence[str]] = None,
                  link_probs: Optional[str] = None,
                  numbers: Optional[Sequence[str]] = None) -> None:
    """Write the Pharaoh lines to `output` ('-' = stdout) and, with `soft`, the `matrices` as
    one compressed .npz file (load with ``numpy.load(soft)["fwd_0"]``); `lines`: the Pharaoh
    lines already formatted (with ``i-j:p`` links), and `numbers` the lines of the
    `link_probs` file (aligner.extract.link_probs.output_lines).

    All are complete before any appears: the .npz and the probabilities go to their temporary
    files first, then the Pharaoh file is written and renamed, then the others are renamed;
    an error on the way removes the temporary files.
    """
    import numpy as np

    from aligner.extract.streaming import optional_output
    from aligner.formats import write_pharaoh
    from aligner.utils import atomic_output

    with optional_output(soft, "wb") as soft_out, optional_output(link_probs) as probs_out:
        if soft_out is not None:
            np.savez_compressed(soft_out, **matrices)
        if probs_out is not None:
            probs_out.writelines(numbers)
        if lines is None:
            write_pharaoh(output, alignments)
        else:
            with atomic_output(output) as out:
                out.writelines(lines)
