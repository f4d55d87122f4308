"""A probability-threshold sweep of scored alignments against gold: precision, recall and AER
at each threshold, and its precision/recall curve as a PNG (`align score-aer --sweep`).

At threshold t a link is kept when its score (aligner.extract.link_probs: the number written with
it, or the mean of its two numbers for a Moses heuristic) is strictly above t, as
``-H soft-average --threshold t`` keeps links: a soft-average file extracted at a low
threshold (e.g. ``--threshold 0.05``) thus gives the curve of every higher one. No torch;
matplotlib (the ``plot`` extra) only when drawing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Dict, List, Mapping, Optional, Sequence, Tuple

from aligner.formats import GoldAlignment
from aligner.links.metrics import AERScore, corpus_stats, score_from_stats, sum_stats
from aligner.utils import check_condition

Link = Tuple[int, int]


@dataclass
class SweepPoint:
    """The scores of the links above one threshold."""

    threshold: float
    score: AERScore


def thresholds(step: float) -> List[float]:
    """0, step, 2·step, ... below 1 (rounded to 6 decimals)."""
    check_condition(0.0 < step < 1.0, f"--sweep-step must be in (0, 1), got {step}")
    count = int(round(1.0 / step))
    values = [round(k * step, 6) for k in range(count + 1)]
    return [t for t in values if t < 1.0]


def sweep(alignments: Sequence[Mapping[Link, Optional[float]]],
          golds: Sequence[GoldAlignment], steps: Sequence[float]) -> List[SweepPoint]:
    """The scores at every threshold of `steps` (links with a score above it)."""
    points = []
    for threshold in steps:
        kept = [{link for link, p in links.items() if p is not None and p > threshold}
                for links in alignments]
        points.append(SweepPoint(threshold, score_from_stats(sum_stats(corpus_stats(kept,
                                                                                     golds)))))
    return points


def best(points: Sequence[SweepPoint]) -> SweepPoint:
    """The point of lowest AER (the lowest threshold among equals)."""
    return min(points, key=lambda p: (p.score.aer, p.threshold))


def as_json(points: Sequence[SweepPoint]) -> List[Dict[str, float]]:
    """Rows for JSON output: threshold, and scores in percent."""
    return [{"threshold": p.threshold, "aer": round(100 * p.score.aer, 10),
             "precision": round(100 * p.score.precision, 10),
             "recall": round(100 * p.score.recall, 10), "f1": round(100 * p.score.f1, 10),
             "links": p.score.n_hyp} for p in points]


def table(points: Sequence[SweepPoint], width: int) -> List[str]:
    """Tab-separated text rows (a header first)."""
    rows = ["threshold\taer\tprecision\trecall\tf1\tlinks"]
    for p in points:
        rows.append(f"{p.threshold:g}\t{100 * p.score.aer:.{width}f}\t"
                    f"{100 * p.score.precision:.{width}f}\t{100 * p.score.recall:.{width}f}\t"
                    f"{100 * p.score.f1:.{width}f}\t{p.score.n_hyp}")
    return rows


def draw(out: IO[bytes], points: Sequence[SweepPoint], title: str, dpi: int = 100) -> None:
    """A PNG of the precision/recall curve: recall on x, precision on y (percent), one dot per
    threshold, every other one labelled, the lowest-AER point ringed."""
    from aligner.links.plot import require_matplotlib

    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    check_condition(len(points) > 0, "nothing to draw")
    figure = Figure(figsize=(6.0, 5.0), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    recall = [100 * p.score.recall for p in points]
    precision = [100 * p.score.precision for p in points]
    ax.plot(recall, precision, marker="o", markersize=3, linewidth=1.2, color="tab:blue")
    for k, p in enumerate(points):
        if k % 2 == 0:
            ax.annotate(f"{p.threshold:g}", (recall[k], precision[k]), fontsize=7,
                        textcoords="offset points", xytext=(4, 4))
    top = best(points)
    ax.scatter([100 * top.score.recall], [100 * top.score.precision], s=80,
               facecolors="none", edgecolors="tab:red", zorder=3,
               label=f"lowest AER {100 * top.score.aer:.1f} at threshold {top.threshold:g}")
    ax.set_xlabel("recall (%)")
    ax.set_ylabel("precision (%)")
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 100)
    ax.grid(True, linewidth=0.3)
    ax.legend(loc="lower left", fontsize=8)
    ax.set_title(title, fontsize=9)
    figure.savefig(out, format="png", dpi=dpi)
