"""`align show`: a PNG of the soft alignment matrices of one sentence pair.

One panel per extraction method of the model kind and per direction (attention, alignment
layer, HMM alignment probability / posterior ...), every panel in source–target orientation;
gold links overlaid with -g. Parses options and delegates to aligner.api (the matrices) and
aligner.links.plot (the drawing). torch and matplotlib are imported inside the command function.
"""
from __future__ import annotations

from typing import Optional, Tuple

import click

from aligner.cli.extract import method_options
from aligner.cli.options import checkpoint_option, device_option, quiet_option, threads_option
from aligner.cli.train import INPUT, bitext_options, check_bitext_args, set_threads
from aligner.utils import (check_condition, check_distinct_files, check_outside_model_dir,
                           check_writable)


@click.command("show")
@click.argument("model_dir", type=click.Path(file_okay=False))
@bitext_options
@click.option("-n", "--line", "line_no", type=click.IntRange(min=1), default=1,
              show_default=True, help="Which sentence pair to draw (1-based line number).")
@click.option("-g", "--gold", type=INPUT, default=None,
              help="Gold alignments of the same file (sure = filled, possible = hollow).")
@click.option("--gold-format", type=click.Choice(["talp", "naacl"]), default="talp",
              show_default=True, help="Gold file format.")
@click.option("-m", "--method", "methods", multiple=True,
              help="Method to draw (repeatable). Default: every method of the model kind.")
@click.option("-O", "--method-option", "method_option", multiple=True, metavar="KEY=VALUE",
              help="Option passed to every drawn method (repeatable; choose the method with -m), "
                   "e.g. -m attention -O layer=2.")
@click.option("--direction", type=click.Choice(["fwd", "rev", "both"]), default="both",
              show_default=True, help="Which directions get panels.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="PNG file to write (atomically).")
@click.option("--dpi", type=click.IntRange(min=10, max=1200), default=100, show_default=True,
              help="Resolution; the size in inches follows the sentence lengths.")
@checkpoint_option
@device_option
@threads_option()
@quiet_option
def command(model_dir: str, source: Optional[str], target: Optional[str], joint: Optional[str],
            line_no: int, gold: Optional[str], gold_format: str, methods: Tuple[str, ...],
            method_option: Tuple[str, ...], direction: str, output: str, dpi: int,
            checkpoint: str, device: str, threads: int, quiet: bool) -> None:
    """Draw the soft alignments of line --line of -s/-t (or -i) with the model in MODEL_DIR.

    Rows are source words, columns target words; darker = more probable. A pair longer than
    the model accepts, or a figure too large to draw, is refused before any work. Example:
    align show model -s test.de -t test.en --line 3 -g test.talp -o pair3.png
    """
    from aligner.links.plot import require_matplotlib

    require_matplotlib()  # fail before loading a model

    from aligner.api import Aligner
    from aligner.data import encode_pair
    from aligner.extract.inference import loaded_max_positions
    from aligner.formats import check_links_in_range, read_bitext, read_gold
    from aligner.links.plot import check_figure_pixels, draw_alignments, figure_size
    from aligner.log import setup_logging
    from aligner.utils import atomic_output

    logger = setup_logging(quiet=quiet)
    set_threads(threads)
    check_bitext_args(source, target, joint, "the sentence pairs")
    check_distinct_files({"-s": source, "-t": target, "-i": joint, "-g": gold}, {"-o": output})
    check_outside_model_dir(model_dir, {"-o": output})
    check_writable(output, "-o")
    options = method_options(method_option)
    bitext = read_bitext(source, target, joint)
    check_condition(line_no <= len(bitext), f"{bitext.source_name}: --line {line_no} is past "
                                            f"the last line ({len(bitext)})")
    src, tgt = bitext.source[line_no - 1], bitext.target[line_no - 1]
    check_condition(bool(src) and bool(tgt), f"{bitext.source_name}:{line_no}: an empty side: "
                                             "nothing to draw")
    directions = ("fwd", "rev") if direction == "both" else (direction,)
    aligner = Aligner.load(model_dir, device, checkpoint, directions)
    src_words, tgt_words = aligner.words(src, "src"), aligner.words(tgt, "tgt")
    where = f"{bitext.source_name}:{line_no}"
    loaded = aligner.loaded
    width = encode_pair(loaded.preprocessor, loaded.src_vocab, loaded.tgt_vocab, src_words,
                        tgt_words).width
    limit = loaded_max_positions(loaded)
    check_condition(limit is None or width <= limit,
                    f"{where}: the pair takes {width} positions, more than the model's limit "
                    f"of {limit}: too long to draw")
    gold_links = None
    if gold is not None:
        gold_links = read_gold(gold, gold_format, None if gold_format == "talp" else len(bitext))
        check_condition(line_no <= len(gold_links),
                        f"{gold}: has {len(gold_links)} sentence pairs, no line {line_no}")
        gold_links = gold_links[line_no - 1]
        check_links_in_range(gold_links.possible, len(src_words), len(tgt_words), gold,
                             line_no)
    for method in methods:
        check_condition(method in aligner.methods,
                        f"unknown method '{method}' for model kind '{aligner.model_kind}' "
                        f"(choose from {', '.join(aligner.methods)})")
    n_panels = len(methods or aligner.methods) * len(directions)
    check_figure_pixels(figure_size(n_panels, len(src_words), len(tgt_words)), dpi, where)
    panels = []
    for method in methods or aligner.methods:
        (_, matrices), = aligner.align([src], [tgt], method, direction, return_probabilities=True,
                                       **options)
        panels += [(f"{method} ({d})", matrices[d]) for d in directions]
    with atomic_output(output, "wb") as out:
        width, height = draw_alignments(out, panels, src_words, tgt_words, gold_links, dpi,
                                        title=f"line {line_no}")
    logger.info("wrote %s: %d panels, %dx%d pixels", output, len(panels), round(width * dpi),
                round(height * dpi))
