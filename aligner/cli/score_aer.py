"""`align score-aer`: AER, precision, recall and F1 of a hypothesis against gold (no torch)."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Set, Tuple

import click

from aligner import __version__
from aligner.links import pr_curve
from aligner.formats import (GOLD_FORMATS, GoldAlignment, check_alignments_against_bitext,
                             check_same_length, read_bitext, read_gold, read_lines)
from aligner.extract.link_probs import check_scored, links_only, read_scored_alignments
from aligner.links.metrics import AERScore, AERStats, corpus_stats, score_from_stats, sum_stats
from aligner.utils import AlignerError, atomic_output, check_condition, check_writable

INPUT = click.Path(dir_okay=False, allow_dash=True)
PER_SENTENCE_COLUMNS = ("sentence", "aer", "precision", "recall", "f1", "links", "sure",
                        "possible", "links_sure", "links_possible")


def signature(gold_format: str, reverse: bool) -> str:
    """Reproducibility signature, e.g. ``aer|gold:talp|dir:src-tgt|v:0.1.0``."""
    direction = "tgt-src" if reverse else "src-tgt"
    return f"aer|gold:{gold_format}|dir:{direction}|v:{__version__}"


def _percentages(score: AERScore) -> Dict[str, float]:
    """Scores in percent (10 decimals, to hide float noise in JSON) and the link counts."""
    def percent(value: float) -> float:
        return round(100.0 * value, 10)

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
@click.option("-g", "--gold", type=INPUT, help="Gold alignments.")
@click.option("-a", "--hypothesis", type=INPUT,
              help="Hypothesis alignments (Pharaoh i-j, 0-based, one line per sentence pair; "
                   "i-j:p links, as align extract --inline-probs writes, are read too, the "
                   "numbers ignored except by --sweep).")
@click.option("--link-probs", type=INPUT, default=None,
              help="Probabilities of the -a links: one line per -a line, one number per link "
                   "in its order (align extract --link-probs, awesome-align "
                   "--output_prob_file); used by --sweep.")
@click.option("--sweep", type=click.Path(dir_okay=False), default=None,
              help="Also score the links whose probability is above each threshold 0, "
                   "--sweep-step, ... < 1 (as -H soft-average --threshold keeps them), print "
                   "the table and draw the precision/recall curve to this PNG (needs "
                   "matplotlib). Every link needs a probability (i-j:p or --link-probs).")
@click.option("--sweep-step", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
              default=0.05, show_default=True, help="Threshold step of --sweep.")
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
@click.option("--translations", type=INPUT,
              help="Translations (one per line, e.g. from align translate): also print "
                   "BLEU and TER (sacrebleu) against --references.")
@click.option("--references", type=INPUT, help="Reference translations for --translations.")
def command(gold: Optional[str], hypothesis: Optional[str], link_probs: Optional[str],
            sweep: Optional[str], sweep_step: float, gold_format: str, reverse: bool,
            per_sentence: bool, as_json: bool, width: int, source: Optional[str],
            target: Optional[str], joint: Optional[str], translations: Optional[str],
            references: Optional[str]) -> None:
    """Score alignments with AER (Och & Ney 2000), precision, recall and F1.

    Link counts are summed over the corpus before dividing (as lilt/alignment-scripts'
    aer.py): P = |A∩P|/|A|, R = |A∩S|/|S|, AER = 1 - (|A∩S| + |A∩P|)/(|A| + |S|).
    Gold carries no sentence lengths; give -s/-t or -i to check every index against them.

    \b
    Examples:
      align score-aer -g data/sample/trial.talp -a gdfa.txt -s data/sample/trial.en \\
          -t data/sample/trial.fr
      align score-aer -g gold.naacl --gold-format naacl -a rev.txt --reverse --json
      align score-aer -g data/sample/trial.talp -a probs.txt --sweep pr.png  (i-j:p links)
    """
    check_condition((gold is None) == (hypothesis is None),
                    "give both -g/--gold and -a/--hypothesis")
    check_condition((translations is None) == (references is None),
                    "give both --translations and --references")
    check_condition(gold is not None or translations is not None,
                    "nothing to score: give -g GOLD -a HYPOTHESIS (and/or --translations "
                    "with --references)")
    check_condition(gold is not None or (link_probs is None and sweep is None),
                    "--link-probs and --sweep score -a against -g: give both")
    if sweep is not None:
        from aligner.links.plot import require_matplotlib

        require_matplotlib()
        check_writable(sweep, "--sweep")
    result: Dict[str, Any] = {}
    lines: List[str] = []
    if gold is not None and hypothesis is not None:
        scored, golds = _read_checked(gold, hypothesis, link_probs, gold_format, reverse,
                                      source, target, joint)
        stats = corpus_stats(links_only(scored), golds)
        score = score_from_stats(sum_stats(stats))
        sig = signature(gold_format, reverse)
        result.update({"signature": sig, "sentences": len(stats), **_percentages(score)})
        if per_sentence:
            result["per_sentence"] = [_percentages(score_from_stats(s)) for s in stats]
            lines.append("\t".join(PER_SENTENCE_COLUMNS))
            lines += [_per_sentence_row(number, sentence, width)
                      for number, sentence in enumerate(stats, start=1)]
        lines += [format_text(score, len(stats), width), f"signature: {sig}"]
        if sweep is not None:
            check_scored(scored, link_probs or hypothesis)
            points = pr_curve.sweep(scored, golds, pr_curve.thresholds(sweep_step))
            with atomic_output(sweep, "wb") as out:
                pr_curve.draw(out, points, f"{os.path.basename(hypothesis)} against "
                                           f"{os.path.basename(gold)} ({len(stats)} pairs)")
            result["sweep"] = pr_curve.as_json(points)
            lines += pr_curve.table(points, width)
    if translations is not None and references is not None:
        for name, value, text in translation_scores(translations, references, width):
            result[name] = value
            lines.append(text)
    click.echo(json.dumps(result, ensure_ascii=False) if as_json else "\n".join(lines))


def _alignment_stats(gold: str, hypothesis: str, gold_format: str, reverse: bool,
                     source: Optional[str], target: Optional[str],
                     joint: Optional[str]) -> List[AERStats]:
    """Read and check hypothesis and gold (and sentences, if given); per-sentence counts."""
    scored, golds = _read_checked(gold, hypothesis, None, gold_format, reverse, source, target,
                                  joint)
    return corpus_stats(links_only(scored), golds)


def _read_checked(gold: str, hypothesis: str, link_probs: Optional[str], gold_format: str,
                  reverse: bool, source: Optional[str], target: Optional[str],
                  joint: Optional[str]
                  ) -> Tuple[List[Dict[Tuple[int, int], Optional[float]]], List[GoldAlignment]]:
    """Read and check hypothesis (links with their probabilities, if any) and gold (and
    sentences, if given)."""
    scored = read_scored_alignments(hypothesis, link_probs, reverse=reverse)
    hyps = links_only(scored)
    if gold_format == "talp":
        golds = read_gold(gold, gold_format)
        check_same_length(gold, len(golds), hypothesis, len(hyps))
    else:  # NAACL names sentences by number; the hypothesis says how many there are
        golds = read_gold(gold, gold_format, n_sentences=len(hyps))
    if source is not None or target is not None or joint is not None:
        bitext = read_bitext(source, target, joint)
        check_alignments_against_bitext(hyps, hypothesis, bitext, reverse=reverse)
        if gold_format == "talp":
            check_alignments_against_bitext([g.possible for g in golds], gold, bitext)
        else:  # NAACL gold has no line per sentence pair: name the sentence number
            for k, (g, src, tgt) in enumerate(zip(golds, bitext.source, bitext.target), start=1):
                _check_naacl_range(g.possible, len(src), len(tgt), gold, k)
    return scored, golds


def _per_sentence_row(number: int, stats: AERStats, width: int) -> str:
    """Tab-separated row in the order of PER_SENTENCE_COLUMNS."""
    row = _percentages(score_from_stats(stats))
    cells = [str(number)]
    cells += [f"{row[key]:.{width}f}" for key in ("aer", "precision", "recall", "f1")]
    cells += [str(row[key]) for key in PER_SENTENCE_COLUMNS[5:]]
    return "\t".join(cells)


def translation_scores(translations: str, references: str,
                       width: int) -> List[Tuple[str, Dict[str, Any], str]]:
    """BLEU and TER of one translation per line against one reference per line (sacrebleu).

    Returns (name, JSON value, text line) per metric; the text line is sacrebleu's own
    ``BLEU|nrefs:1|...|version:2.x = 22.41 ...``.
    """
    from sacrebleu.metrics import BLEU, TER  # only when asked: keeps the command light

    hyps = read_lines(translations)
    refs = read_lines(references)
    check_same_length(references, len(refs), translations, len(hyps))
    scores = []
    for name, metric in (("bleu", BLEU()), ("ter", TER())):
        score = metric.corpus_score(hyps, [refs])
        sig = str(metric.get_signature())
        scores.append((name, {"score": round(score.score, 10), "signature": sig},
                       score.format(width=width, signature=sig)))
    return scores


def _check_naacl_range(links: Set[Tuple[int, int]], src_len: int, tgt_len: int, name: str,
                       sentence: int) -> None:
    """Range check of NAACL gold links, quoting them 1-based as written in the file."""
    for i, j in sorted(links):
        if i >= src_len or j >= tgt_len:
            raise AlignerError(f"{name}: sentence {sentence}: link '{i + 1} {j + 1}' outside "
                               f"the sentence pair (source has {src_len} words, "
                               f"target has {tgt_len})")
