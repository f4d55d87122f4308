"""AER of several alignments of one bitext's gold lines, by the length of the line.

Each system is a Pharaoh file with one line per bitext line (`align run -o/-f/-r`, `align
extract -o`, eflomal's output), or ``round:R`` of a self-training model directory: the links
MODEL_DIR/rounds/R/links.align, which cover only the lines of round R+1's sample (R = 0: the
teacher's links of round 1's lines), mapped back to bitext lines by the run's seed and its
--round-pairs / --fine-tune-share (aligner/training/samples.py). Only the gold lines that
every system covers are scored, so that the columns compare the same lines.

    python eval/aer_by_length.py --gold ../shared/data/jaen/dev.talp \\
        --gold-source ../shared/data/jaen/dev.src --first-line 50001 --lines 50291 \\
        --model-dir m1 teacher=round:0 round1=round:1 final=out.align
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aligner.formats import parse_links, read_gold, read_lines  # noqa: E402
from aligner.links.metrics import corpus_stats, score_from_stats, sum_stats  # noqa: E402
from aligner.training.samples import sample_lines  # noqa: E402

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
@click.option("--gold", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--gold-source", required=True, type=click.Path(exists=True, dir_okay=False),
              help="The gold lines' source sentences (their length picks the bucket).")
@click.option("--first-line", required=True, type=int, help="Bitext line of the gold's first.")
@click.option("--lines", "n_lines", required=True, type=int, help="Lines of the bitext.")
@click.option("--model-dir", default=None, help="The model directory of the round:R systems.")
@click.argument("systems", nargs=-1, required=True)
def main(gold, gold_source, first_line, n_lines, model_dir, systems):
    """Print one Markdown table: AER (precision / recall) per bucket and system."""
    golds = read_gold(gold)
    lengths = [len(line.split()) for line in read_lines(gold_source)]
    wanted = [first_line - 1 + k for k in range(len(golds))]
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
    common = [k for k in range(len(golds))
              if all(first_line - 1 + k in links for links in columns.values())]
    print(f"{len(common)} of {len(golds)} gold lines in every system\n")
    print("| source words | lines | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for low, high in BUCKETS + ((0, 10 ** 9),):
        chosen = [k for k in common if low <= lengths[k] < high]
        label = "all" if (low, high) == (0, 10 ** 9) else (
            f"{low}+" if high == 10 ** 9 else f"{low}-{high - 1}")
        cells = []
        for links in columns.values():
            score = score_from_stats(sum_stats(corpus_stats(
                [links[first_line - 1 + k] for k in chosen], [golds[k] for k in chosen])))
            cells.append(f"{100 * score.aer:.1f} ({100 * score.precision:.1f} / "
                         f"{100 * score.recall:.1f})")
        print(f"| {label} | {len(chosen)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
