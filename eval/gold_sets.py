"""The one gold-set syntax of the eval/ scripts: ``--gold NAME SRC TGT GOLD`` (repeatable).

NAME labels the set in reports; SRC and TGT are its sentences (line-aligned, tokenized as
`align` reads them) and GOLD its talp gold (``i-j`` sure, ``ipj`` / ``i?j`` possible), one
line per sentence pair. Every script that takes gold sets declares the option with
:func:`add_gold_argument` (argparse) or :func:`gold_option` (click) and reads it with
:func:`load_gold_sets`; every score is ``aligner.links.metrics.score_aer``, the scorer of
`align score-aer`.

Where a script scores the alignments of a whole text (`align run` output, a model's rounds, the
classical teacher), the gold sets' sentences are lines of that text (the benchmark convention
appends them to the training text, as eval/compare_aligners.py does) and :func:`locate` finds
them there, so no script takes line numbers.

A bad gold set stops the script with one line naming the set and the file (and line):
missing file, wrong number of values, a name given twice, line counts that differ, a gold link
outside its sentence pair, or sentences that are not lines of the text.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aligner.formats import (GoldAlignment, check_links_in_range,  # noqa: E402
                             check_same_length, read_bitext, read_gold)
from aligner.utils import AlignerError, check_condition  # noqa: E402

METAVAR = ("NAME", "SRC", "TGT", "GOLD")
HELP = ("a gold set: its name, source and target sentences, and talp gold (i-j sure, ipj "
        "possible); repeatable")


@dataclass
class GoldSet:
    """One gold set, read and checked. ``offset``: the 0-based line of its first sentence
    pair in a text, once :func:`locate` has found it (or where a script appended it)."""

    name: str
    source: str
    target: str
    gold_path: str
    sources: List[List[str]]
    targets: List[List[str]]
    golds: List[GoldAlignment]
    offset: Optional[int] = None

    @property
    def size(self) -> int:
        return len(self.golds)


def add_gold_argument(parser: argparse.ArgumentParser, required: bool = True,
                      use: str = "") -> None:
    """``--gold NAME SRC TGT GOLD`` (repeatable) on an argparse parser; ``use``: what the
    script does with the sets, added to the help."""
    parser.add_argument("--gold", nargs=4, action="append", required=required,
                        default=None if required else [], metavar=METAVAR,
                        help=HELP + (f"; {use}" if use else ""))


def gold_option(required: bool = True, use: str = ""):
    """``--gold NAME SRC TGT GOLD`` (repeatable) as a click option decorator."""
    import click

    return click.option("--gold", "gold", nargs=4, multiple=True, required=required,
                        type=(str, str, str, str), metavar=" ".join(METAVAR),
                        help=HELP + (f"; {use}" if use else ""))


def check_gold_args(values: Sequence[Sequence[str]]) -> None:
    """AlignerError (one line) unless every value is NAME SRC TGT GOLD with existing files
    and names are unique."""
    names = set()
    for value in values:
        check_condition(len(value) == 4, f"--gold {' '.join(value)}: expected 4 values, "
                                         f"NAME SRC TGT GOLD; got {len(value)}")
        name = value[0]
        check_condition(bool(name), "--gold: empty gold set name")
        check_condition(name not in names, f"--gold: gold set name '{name}' given twice")
        names.add(name)
        for path in value[1:]:
            check_condition(os.path.isfile(path),
                            f"--gold {name}: {path} is not a file")


def load_gold_set(name: str, source: str, target: str, gold_path: str,
                  allow_empty: bool = True) -> GoldSet:
    """Read one gold set; AlignerError naming file and line when SRC, TGT and GOLD have
    different line counts, a gold link lies outside its sentence pair, or (``allow_empty``
    False: the peers of eval/compare_aligners.py cannot align it) a sentence is empty."""
    bitext = read_bitext(source=source, target=target)
    golds = read_gold(gold_path)
    check_same_length(source, len(bitext), gold_path, len(golds))
    for line_no, (src, tgt, links) in enumerate(zip(bitext.source, bitext.target, golds),
                                                 start=1):
        check_condition(allow_empty or (bool(src) and bool(tgt)),
                        f"{source if not src else target}:{line_no}: empty gold sentence "
                        "(the peers cannot align it)")
        check_links_in_range(links.possible, len(src), len(tgt), gold_path, line_no)
    return GoldSet(name, source, target, gold_path, bitext.source, bitext.target, golds)


def load_gold_sets(values: Sequence[Sequence[str]], allow_empty: bool = True
                   ) -> List[GoldSet]:
    """The gold sets of ``--gold`` values (checked by :func:`check_gold_args` first)."""
    check_gold_args(values)
    return [load_gold_set(*value, allow_empty=allow_empty) for value in values]


def locate(gold_sets: Sequence[GoldSet], sources: Sequence[Sequence[str]],
           targets: Sequence[Sequence[str]], text: str) -> None:
    """Set each gold set's ``offset``: the first line of the last block of consecutive lines
    of the text (``sources``/``targets``, tokenized) equal to its sentence pairs.

    AlignerError (one line) when a set's sentences are not consecutive lines of the text
    (``text`` names it in the message).
    """
    for gold_set in gold_sets:
        found = None
        if gold_set.size:
            first = (list(gold_set.sources[0]), list(gold_set.targets[0]))
            for start in range(len(sources) - gold_set.size, -1, -1):
                if (list(sources[start]), list(targets[start])) != first:
                    continue
                if all(list(sources[start + k]) == list(gold_set.sources[k])
                       and list(targets[start + k]) == list(gold_set.targets[k])
                       for k in range(gold_set.size)):
                    found = start
                    break
        check_condition(found is not None,
                        f"gold set '{gold_set.name}': its {gold_set.size} sentence pairs "
                        f"({gold_set.source}, {gold_set.target}) are not consecutive lines of "
                        f"{text} (append them to the text, as the benchmark convention does)")
        gold_set.offset = found


def exit_on_error(prog: str):
    """Decorator: an AlignerError of the wrapped function ends the script with one line
    ``PROG: error: MESSAGE`` and exit status 2 (as argparse reports bad options)."""
    def wrap(function):
        @functools.wraps(function)
        def run(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except AlignerError as error:
                print(f"{prog}: error: {error}", file=sys.stderr)
                sys.exit(2)
        return run
    return wrap
