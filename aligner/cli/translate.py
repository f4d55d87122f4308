"""`align translate`: beam-search translation with a trained model directory, optionally with
each translation's word alignment. Only parses options and prints; the work is
aligner.translate. torch is imported inside the command function.
"""
from __future__ import annotations

from typing import Optional

import click

from aligner import constants as C
from aligner.cli.options import (checkpoint_option, device_option, inference_precision_option,
                                 quiet_option, threads_option)
from aligner.cli.train import FiniteFloat

INPUT = click.Path(dir_okay=False, allow_dash=True)


@click.command("translate")
@click.argument("model_dir", type=click.Path(file_okay=False))
@click.option("-i", "--input", "input_path", type=INPUT, default="-", show_default=True,
              help="Sentences to translate, one per line (tokenized like the training data); "
                   "'-' = stdin.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default="-",
              show_default=True, help="Translations (written atomically); '-' = stdout.")
@click.option("--direction", type=click.Choice(["fwd", "rev"]), default="fwd",
              show_default=True,
              help="fwd: source language -> target language; rev: the other way round.")
@click.option("-b", "--beam", type=click.IntRange(min=1), default=5, show_default=True,
              help="Beam size (1 = greedy).")
@click.option("--print-alignment", is_flag=True,
              help="Print 'translation ||| i-j ...': input word i linked to output word j "
                   "(0-based, words after BPE is undone).")
@click.option("--alignment-method", default=None,
              help="Extraction method for --print-alignment [default: transformer attention "
                   "(penultimate layer), hmm0 hmm-posterior, hmm1 hmm-viterbi, "
                   "alignment-layer layer-sgd, the guided layer layer].")
@click.option("-H", "--symmetrize", "heuristic", type=click.Choice(C.HEURISTICS),
              default=None,
              help="With --print-alignment: combine the translating model's alignment with "
                   "the other direction's alignment of (input, translation) by this Moses "
                   "heuristic, as `align extract -H` does (the model directory must hold both "
                   "directions) [default: the translating direction's alignment alone].")
@click.option("--max-len-a", type=FiniteFloat(min=0), default=1.5, show_default=True,
              help="Longest output = a * input subwords + b.")
@click.option("--max-len-b", type=click.IntRange(min=0), default=10, show_default=True,
              help="See --max-len-a.")
@click.option("--len-penalty", type=FiniteFloat(), default=1.0, show_default=True,
              help="Hypothesis score = log-probability / length ** len_penalty "
                   "(0 = no length normalization).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=8000, show_default=True,
              help="Beam rows x padded input subwords per batch (inputs are batched by "
                   "length; output order = input order).")
@checkpoint_option
@device_option
@inference_precision_option
@threads_option()
@quiet_option
def command(model_dir: str, input_path: str, output: str, direction: str, beam: int,
            print_alignment: bool, alignment_method: Optional[str], heuristic: Optional[str],
            max_len_a: float,
            max_len_b: int, len_penalty: float, max_tokens: int, checkpoint: str, device: str,
            precision: str, threads: int, quiet: bool) -> None:
    """Translate the lines of -i with the model in MODEL_DIR (any model kind).

    Prints one translation per input line, in input order (an empty line, or one too long
    for the model, gives an empty line and a warning). The model applies its own BPE (and
    its tokenizer when trained with --tokenize); the output has BPE undone and is not
    detokenized. Score it with: align score-aer --translations OUT --references REF.

    Example: align translate runs/enfr -i test.en --beam 5 --print-alignment -H grow-diag
    """
    from aligner.cli.train import set_threads
    from aligner.distributed import resolve_device
    from aligner.formats import read_lines
    from aligner.log import setup_logging
    from aligner.model_dir import LoadedModelDir
    from aligner.precision import autocast_context, resolve_precision
    from aligner.translate import translate
    from aligner.utils import (atomic_output, check_condition, check_outside_model_dir,
                               check_writable)

    setup_logging(quiet=quiet)
    set_threads(threads)
    check_outside_model_dir(model_dir, {"-o": output})
    check_condition(alignment_method is None or print_alignment,
                    "--alignment-method chooses the alignment of --print-alignment: give both")
    check_condition(heuristic is None or print_alignment,
                    "--symmetrize combines the alignments of --print-alignment: give both")
    check_writable(output, "-o")   # before the model loads and the lines are translated
    lines = read_lines(input_path)
    torch_device = resolve_device(device)
    precision = resolve_precision(precision, torch_device)
    directions = (direction,)
    if heuristic is not None:
        other = "rev" if direction == "fwd" else "fwd"
        trained = LoadedModelDir.load(model_dir, (), checkpoint, torch_device).config.directions
        check_condition(other in trained,
                        f"{model_dir}: --symmetrize combines both directions' alignments, and "
                        f"this model directory holds {', '.join(trained)} only")
        directions = C.DIRECTIONS
    loaded = LoadedModelDir.load(model_dir, directions, checkpoint, torch_device)
    if alignment_method is not None:
        for name in directions:
            methods = loaded.models[name].METHODS
            check_condition(alignment_method in methods,
                            f"unknown --alignment-method '{alignment_method}' for model kind "
                            f"'{loaded.config.model_kind}' (choose from {', '.join(methods)})")
    with autocast_context(precision, torch_device):
        results = translate(loaded, lines, direction, beam, max_len_a, max_len_b, len_penalty,
                            max_tokens, print_alignment, alignment_method, torch_device,
                            input_path, heuristic)
    with atomic_output(output) as out:
        for result in results:
            if print_alignment:
                links = " ".join(f"{i}-{j}" for i, j in sorted(result.links or ()))
                out.write(f"{result.text} ||| {links}\n")
            else:
                out.write(result.text + "\n")
