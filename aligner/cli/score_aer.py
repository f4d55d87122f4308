"""`align score-aer`: AER, precision, recall and F1 of a hypothesis against gold (no torch)."""
from __future__ import annotations

import json
from typing import Dict, List, Optional, Set, Tuple

import click

from aligner import __version__
from aligner.formats import (GOLD_FORMATS, check_alignments_against_bitext, check_same_length,
                             read_bitext, read_gold, read_pharaoh)
from aligner.metrics import AERScore, corpus_stats, score_from_stats, sum_stats
from aligner.utils import AlignerError

INPUT = click.Path(dir_okay=False, allow_dash=True)
PER_SENTENCE_COLUMNS = ("sentence", "aer", "precision", "recall", "f1", "links", "sure",
                        "possible", "links_sure", "links_possible")


def signature(gold_format: str, reverse: bool) -> str:
    """Reproducibility signature, e.g. ``aer|gold:talp|dir:src-tgt|v:0.1.0``."""
    direction = "tgt-src" if reverse else "src-tgt"
    return f"aer|gold:{gold_format}|dir:{direction}|v:{__version__}"


def _percentages(score: AERScore, digits: Optional[int]) -> Dict[str, float]:
    """Scores in percent (rounded to ``digits`` when given) and the link counts."""
    def percent(value: float) -> float:
        return round(100.0 * value, digits if digits is not None else 10)

    return {"aer": percent(score.aer), "precision": percent(score.precision),
            "recall": percent(score.recall), "f1": percent(score.f1),
            "links": score.n_hyp, "sure": score.n_sure, "possible": score.n_possible,
            "links_sure": score.hyp_and_sure, "links_possible": score.hyp_and_possible}


def format_text(score: AERScore, n_sentences: int, width: int) -> str:
    """One human-readable line: ``AER 21.4  P 94.3  R 67.2  F1 78.5  links 6974 ...``."""
    return (f"AER {100 * score.aer:.{width}f}  P {100 * score.precision:.{width}f}  "
            f"R {100 * score.recall:.{width}f}  F1 {100 * score.f1:.{width}f}  "
            f"links {score.n_hyp}  sure {score.n_sure}  possible {score.n_possible}  "
            f"sentences {n_sentences}")


@click.command("score-aer")
@click.option("-g", "--gold", required=True, type=INPUT, help="Gold alignments.")
@click.option("-a", "--hypothesis", required=True, type=INPUT,
              help="Hypothesis alignments (Pharaoh i-j, 0-based, one line per sentence pair).")
@click.option("--gold-format", type=click.Choice(GOLD_FORMATS), default="talp",
              show_default=True,
              help="talp: i-j sure, ipj or i?j possible, one line per pair (0-based); "
                   "naacl: 'sentence i j [S|P]' lines, 1-based, NULL (0) dropped.")
@click.option("--reverse", is_flag=True,
              help="The hypothesis is written target-source (e.g. a GIZA++ reverse run).")
@click.option("--per-sentence", is_flag=True,
              help="Also print one tab-separated row of scores per sentence pair.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (scores in percent).")
@click.option("-w", "--width", type=click.IntRange(0, 10), default=1, show_default=True,
              help="Decimals of the percentages in text output.")
@click.option("-s", "--source", type=INPUT, help="Source sentences, to check link indices.")
@click.option("-t", "--target", type=INPUT, help="Target sentences, to check link indices.")
@click.option("-i", "--input", "joint", type=INPUT,
              help="'source ||| target' file, to check link indices (instead of -s/-t).")
def command(gold: str, hypothesis: str, gold_format: str, reverse: bool, per_sentence: bool,
            as_json: bool, width: int, source: Optional[str], target: Optional[str],
            joint: Optional[str]) -> None:
    """Score alignments with AER (Och & Ney 2000), precision, recall and F1.

    Link counts are summed over the corpus before dividing (as lilt/alignment-scripts'
    aer.py): P = |A∩P|/|A|, R = |A∩S|/|S|, AER = 1 - (|A∩S| + |A∩P|)/(|A| + |S|).
    Gold carries no sentence lengths; give -s/-t or -i to check every index against them.
    """
    hyps = read_pharaoh(hypothesis, reverse=reverse)
    golds = read_gold(gold, gold_format, n_sentences=len(hyps))
    check_same_length(gold, len(golds), hypothesis, len(hyps))
    if source is not None or target is not None or joint is not None:
        bitext = read_bitext(source, target, joint)
        check_alignments_against_bitext(hyps, hypothesis, bitext, reverse=reverse)
        if gold_format == "talp":  # naacl gold has no line per sentence pair to name
            check_alignments_against_bitext([g.possible for g in golds], gold, bitext)
        else:
            for k, (g, src, tgt) in enumerate(zip(golds, bitext.source, bitext.target), start=1):
                _check_naacl_range(g.possible, len(src), len(tgt), gold, k)
    stats = corpus_stats(hyps, golds)
    score = score_from_stats(sum_stats(stats))
    sig = signature(gold_format, reverse)
    if as_json:
        result = {"signature": sig, "sentences": len(hyps), **_percentages(score, None)}
        if per_sentence:
            result["per_sentence"] = [_percentages(score_from_stats(s), None) for s in stats]
        click.echo(json.dumps(result, ensure_ascii=False))
        return
    if per_sentence:
        click.echo("\t".join(PER_SENTENCE_COLUMNS))
        for number, sentence in enumerate(stats, start=1):
            row = _percentages(score_from_stats(sentence), width)
            cells: List[str] = [str(number)]
            cells += [f"{row[key]:.{width}f}" for key in ("aer", "precision", "recall", "f1")]
            cells += [str(row[key]) for key in PER_SENTENCE_COLUMNS[5:]]
            click.echo("\t".join(cells))
    click.echo(format_text(score, len(hyps), width))
    click.echo(f"signature: {sig}")


def _check_naacl_range(links: Set[Tuple[int, int]], src_len: int, tgt_len: int, name: str,
                       sentence: int) -> None:
    """Range check of NAACL gold links, quoting them 1-based as written in the file."""
    for i, j in sorted(links):
        if i >= src_len or j >= tgt_len:
            raise AlignerError(f"{name}: sentence {sentence}: link '{i + 1} {j + 1}' outside "
                               f"the sentence pair (source has {src_len} words, "
                               f"target has {tgt_len})")
