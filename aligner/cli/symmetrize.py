"""`align symmetrize`: combine forward and reverse Pharaoh files with a heuristic (no torch)."""
from __future__ import annotations

from typing import Optional

import click

from aligner.cli.options import quiet_option
from aligner.constants import DEFAULT_HEURISTIC
from aligner.formats import (check_alignments_against_bitext, check_same_length, read_bitext,
                             read_pharaoh, write_pharaoh)
from aligner.links.combine import combine
from aligner.links.symmetrize import HEURISTICS
from aligner.utils import check_distinct_files, check_writable

INPUT = click.Path(dir_okay=False, allow_dash=True)


@click.command("symmetrize")
@click.option("-f", "--forward", required=True, type=INPUT,
              help="Forward alignments (Pharaoh, source-target), e.g. from p(tgt|src).")
@click.option("-r", "--reverse", required=True, type=INPUT,
              help="Reverse alignments (Pharaoh), e.g. from p(src|tgt).")
@click.option("-H", "--heuristic", type=click.Choice(list(HEURISTICS)),
              default=DEFAULT_HEURISTIC, show_default=True, help="Symmetrization heuristic.")
@click.option("--reverse-orientation", type=click.Choice(["src-tgt", "tgt-src"]),
              default="src-tgt", show_default=True,
              help="Index order of the reverse file: src-tgt (fast_align -r, align extract) "
                   "or tgt-src (GIZA++ style).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default="-",
              show_default=True, help="Output file (written atomically); '-' is stdout.")
@click.option("-s", "--source", type=INPUT, help="Source sentences, to check link indices.")
@click.option("-t", "--target", type=INPUT, help="Target sentences, to check link indices.")
@click.option("-i", "--input", "joint", type=INPUT,
              help="'source ||| target' file, to check link indices (instead of -s/-t).")
@quiet_option
def command(forward: str, reverse: str, heuristic: str, reverse_orientation: str, output: str,
            source: Optional[str], target: Optional[str], joint: Optional[str],
            quiet: bool) -> None:
    """Symmetrize two directional alignments (semantics of fast_align's `atools -c`).

    Reads one Pharaoh line per sentence pair from each file and writes one line per sentence
    pair, links in source-target order, sorted. With -s/-t or -i every link index is checked
    against the sentence lengths.

    \b
    Examples:
      align symmetrize -f fwd.txt -r rev.txt -H grow-diag-final-and -o gdfa.txt
      align symmetrize -f giza.talp -r giza.reverse.talp --reverse-orientation tgt-src
    """
    check_distinct_files({"-f": forward, "-r": reverse, "-s": source, "-t": target,
                          "-i": joint}, {"-o": output})
    check_writable(output, "-o")  # before reading: fail now, not after the work
    fwd = read_pharaoh(forward)
    rev = read_pharaoh(reverse, reverse=reverse_orientation == "tgt-src")
    check_same_length(forward, len(fwd), reverse, len(rev))
    if source is not None or target is not None or joint is not None:
        bitext = read_bitext(source, target, joint)
        check_alignments_against_bitext(fwd, forward, bitext)
        check_alignments_against_bitext(rev, reverse, bitext,
                                        reverse=reverse_orientation == "tgt-src")
    result = combine(heuristic, hard={"fwd": fwd, "rev": rev})
    write_pharaoh(output, result)
    if not quiet:
        click.echo(f"align symmetrize: {len(result)} sentence pairs, {heuristic}: "
                   f"{sum(map(len, result))} links (forward {sum(map(len, fwd))}, "
                   f"reverse {sum(map(len, rev))})", err=True)
