"""AER of several alignments of one bitext's gold lines, by the length of the line.

Each system is a Pharaoh file with one line per bitext line (`align run -o/-f/-r`, `align
extract -o`, eflomal's output), or ``round:R`` of a self-training model directory: the links
MODEL_DIR/rounds/R/links.align, which cover only the lines of round R+1's sample (R = 0: the
teacher's links of round 1's lines), mapped back to bitext lines by the run's seed and its
--round-pairs / --fine-tune-share (aligner/training/samples.py). The gold sets (``--gold NAME
SRC TGT GOLD``, eval/gold_sets.py) are found among the lines of the bitext ``--text``. Only the
gold lines that every system covers are scored, so that the columns compare the same lines;
every cell is aligner.links.metrics.score_aer of its lines, as `align score-aer` scores.

    python eval/aer_by_length.py --text train.ja train.en \\
        --gold dev ../shared/data/jaen/dev.src ../shared/data/jaen/dev.tgt \\
        ../shared/data/jaen/dev.talp \\
        --model-dir m1 teacher=round:0 round1=round:1 final=out.align
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Dict, Sequence, Set, Tuple

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gold_sets import gold_option, load_gold_sets, locate  # noqa: E402

from aligner.formats import parse_links, read_bitext, read_lines  # noqa: E402
from aligner.links.metrics import score_aer  # noqa: E402
from aligner.training.samples import sample_lines  # noqa: E402
from aligner.utils import AlignerError  # noqa: E402

Link = Tuple[int, int]
#: source-length buckets (words): [low, high)
BUCKETS = ((0, 15), (15, 25), (25, 40), (40, 10 ** 9))


def round_links(model_dir: str, round_number: int, n_lines: int) -> Dict[int, Set[Link]]:
    """{0-based bitext line: links} of MODEL_DIR/rounds/R/links.align (round R+1's lines)."""
    config = os.path.join(model_dir, "config.json")
    if not os.path.isfile(config):   # a run still in its rounds: round 1's config
        config = os.path.join(model_dir, "rounds", "1", "config.json")
    with open(config, encoding="utf-8") as handle:
        seed = int(json.load(handle)["training"]["seed"])
    with open(os.path.join(model_dir, "rounds", "settings.json"), encoding="utf-8") as handle:
        settings = json.load(handle)["settings"]
    sample = sample_lines(n_lines, int(settings["--round-pairs"]), seed, round_number + 1,
                          float(settings["--fine-tune-share"]))
    lines = sample if sample is not None else range(n_lines)
    path = os.path.join(model_dir, "rounds", str(round_number), "links.align")
    texts = read_lines(path)
    return {int(line): parse_links(text, path, n + 1)
            for n, (line, text) in enumerate(zip(lines, texts))}


def file_links(path: str, wanted: Sequence[int]) -> Dict[int, Set[Link]]:
    """{0-based bitext line: links} of the `wanted` lines of a Pharaoh file."""
    texts = read_lines(path)
    return {line: parse_links(texts[line], path, line + 1) for line in wanted}


@click.command()
@click.option("--text", nargs=2, required=True, type=click.Path(exists=True, dir_okay=False),
              metavar="SRC TGT", help="The bitext the systems align (the gold sets among its "
                                      "lines).")
@gold_option(use="found among the lines of --text")
@click.option("--model-dir", default=None, help="The model directory of the round:R systems.")
@click.argument("systems", nargs=-1, required=True)
def main(text, gold, model_dir, systems):
    """Print one Markdown table per gold set: AER (precision / recall) per bucket and system."""
    try:
        gold_sets = load_gold_sets(gold)
        bitext = read_bitext(*text)
        locate(gold_sets, bitext.source, bitext.target, " ".join(text))
    except AlignerError as error:
        raise click.UsageError(str(error)) from None
    n_lines = len(bitext)
    wanted = sorted({g.offset + k for g in gold_sets for k in range(g.size)})
    columns: Dict[str, Dict[int, Set[Link]]] = {}
    for spec in systems:
        name, _, source = spec.partition("=")
        source = source or name
        if source.startswith("round:"):
            if model_dir is None:
                raise click.UsageError(f"{spec}: give --model-dir")
            columns[name] = round_links(model_dir, int(source[6:]), n_lines)
        else:
            columns[name] = file_links(source, wanted)
    for gold_set in gold_sets:
        first = gold_set.offset
        lengths = [len(words) for words in gold_set.sources]
        common = [k for k in range(gold_set.size)
                  if all(first + k in links for links in columns.values())]
        print(f"## {gold_set.name}: {len(common)} of {gold_set.size} gold lines (text lines "
              f"{first + 1}-{first + gold_set.size}) in every system\n")
        print("| source words | lines | " + " | ".join(columns) + " |")
        print("|---|---|" + "---|" * len(columns))
        for low, high in BUCKETS + ((0, 10 ** 9),):
            chosen = [k for k in common if low <= lengths[k] < high]
            label = "all" if (low, high) == (0, 10 ** 9) else (
                f"{low}+" if high == 10 ** 9 else f"{low}-{high - 1}")
            cells = []
            for links in columns.values():
                score = score_aer([links[first + k] for k in chosen],
                                  [gold_set.golds[k] for k in chosen])
                cells.append(f"{100 * score.aer:.1f} ({100 * score.precision:.1f} / "
                             f"{100 * score.recall:.1f})")
            print(f"| {label} | {len(chosen)} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main()
