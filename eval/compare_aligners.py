"""Side-by-side benchmark: eflomal, fast_align and `align` methods on one bitext, one table.

Set-up (the project's benchmark convention): every system trains on the training pairs with
the gold sets' sentences appended at the end, in the order given; the last lines (one block
per gold set) are then scored against each gold set. For every system the table gives AER,
precision and recall of the forward links (model p(target | source)), the reverse links
(p(source | target)), and their grow-diag and grow-diag-final-and symmetrizations, plus wall
time and peak memory. Symmetrization and scoring use the project's own library
(aligner.links.symmetrize, aligner.links.metrics), so every system is scored by the same code.

Each command of a system runs in its own child process; its wall time is measured around it
and its peak memory is the largest resident set size of the process and its waited-for
descendants (``os.wait4``; ``ru_maxrss``; see ``run_measured``). A system's time is the sum
over its commands, its peak the maximum.

Peers (``pip install -r eval/requirements-peers.txt``; see eval/peers.py) are optional: a
missing peer gets a "not run" row. Our own aligner joins in two ways:

* ``--aligner-method KIND:METHOD`` trains here: ``align train --model KIND`` once per kind on
  the corpus, then ``align extract --method METHOD`` of each direction on the gold sentences;
  time = training + extraction, peak = the larger of the two.
* ``--aligner-model [LABEL=]DIR:METHOD[,KEY=VALUE...]`` takes a model directory trained
  beforehand (both directions; a directory joined from two one-direction runs works), with
  method options given to ``align extract -O`` (``runs/enfr-transformer:attention,layer=1``;
  this replaced eval/run_aer.py). Only ``align extract`` runs here. Time = the training seconds
  the directory records in its run record (``DIR/run.json``: preparation, the classical teacher,
  training, a self-training run's guides, over every round and resumed session; the directions
  trained side by side count as the longer; for an alignment layer also its base's) + the
  extraction measured here; a directory trained before run records counts the last ``elapsed_s``
  of each direction's ``metrics.tsv`` only, and a note says so. Peak = extraction only. Before
  anything runs, the model's training text must be the benchmark corpus line for line
  (:func:`check_training_text`: the encoded ``DIR/corpus`` against the benchmark corpus encoded
  with the model's own BPE and vocabularies; without ``corpus/``, the fingerprint and pair count
  of the training text that ``DIR/run.json`` records); a mismatch is an error unless
  ``--allow-other-training-text``, which marks the row.

``--heuristics`` chooses the symmetrized columns (default intersect, grow-diag,
grow-diag-final-and; also union, grow-diag-final).

Example (en-fr, 25k training pairs, dev and trial scored separately)::

    python eval/compare_aligners.py --title "en-fr" \\
        --train ../shared/data/enfr/train.src ../shared/data/enfr/train.tgt \\
        --gold dev ../shared/data/enfr/dev.src ../shared/data/enfr/dev.tgt \\
                   ../shared/data/enfr/dev.talp \\
        --gold trial ../shared/data/enfr/trial.src ../shared/data/enfr/trial.tgt \\
                     ../shared/data/enfr/trial.talp \\
        --output eval/results/compare_enfr.md

and a model trained beforehand on exactly that corpus (``cat`` of train, dev, trial) added as
``--aligner-model runs/enfr-hmm1:hmm-posterior``.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Set, Tuple

import click

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (eval/ is a recipe folder, not a package)
from gold_sets import GoldSet, gold_option, load_gold_sets  # noqa: E402

from aligner import __version__ as aligner_version  # noqa: E402
from aligner import constants as C  # noqa: E402
from aligner.formats import (check_links_in_range, read_bitext, read_pharaoh,  # noqa: E402
                             write_pharaoh)
from aligner.links.metrics import AERScore, score_aer  # noqa: E402
from aligner.links.symmetrize import HEURISTICS as SYMMETRIZE_HEURISTICS  # noqa: E402
from aligner.links.symmetrize import symmetrize  # noqa: E402
from aligner.utils import AlignerError, atomic_output, check_condition  # noqa: E402

if TYPE_CHECKING:  # pragma: no cover
    from aligner.data import EncodedCorpus

Link = Tuple[int, int]
# Table columns: the two directions, then the symmetrizations computed from them.
DIRECTIONS = C.DIRECTIONS
HEURISTICS = ("intersect", "grow-diag", "grow-diag-final-and")
# A column only `align` rows fill: the two directions' soft alignments averaged and
# thresholded (`align extract --direction both -H soft-average`: at 0.5, or at the threshold
# `align run` or a self-training `align train` recorded in its model directory); peers give
# no probabilities, their cell stays empty.
SOFT_COLUMN = "soft-average"
COLUMNS = DIRECTIONS + HEURISTICS + (SOFT_COLUMN,)


@dataclass
class Corpus:
    """The benchmark corpus written to the work folder: training pairs, then the gold sets.

    ``sources[k]``/``targets[k]`` are the tokens of corpus line k (0-based); ``gold_sets``
    cover the last lines, from ``first_gold_line`` to the end.
    """

    source: str
    target: str
    joint: str
    gold_source: str
    gold_target: str
    sources: List[List[str]]
    targets: List[List[str]]
    n_train: int
    n_dropped: int
    gold_sets: List[GoldSet]

    @property
    def first_gold_line(self) -> int:
        return self.n_train

    def __len__(self) -> int:
        return len(self.sources)


def _check_no_separator(tokens: Sequence[str], path: str, line_no: int) -> None:
    """A '|||' token would split the joint file's line in the wrong place (fast_align)."""
    check_condition("|||" not in tokens, f"{path}:{line_no}: the token '|||' cannot be "
                                         "written to a 'source ||| target' file")


def build_corpus(train: Sequence[Tuple[str, str]],
                 gold: Sequence[Tuple[str, str, str, str]],
                 workdir: str, train_limit: Optional[int] = None) -> Corpus:
    """Concatenate training files (at most ``train_limit`` pairs), append the gold sentences.

    ``train``: (source file, target file) pairs; ``gold``: (name, source, target, talp gold).
    Training pairs with an empty side are left out (fast_align and eflomal cannot train on
    them) and counted in ``n_dropped``; the gold sentences are kept line for line, so gold line
    k is corpus line ``offset + k``. Writes ``corpus.{src,tgt,joint}`` (joint =
    ``source ||| target``) and ``gold.{src,tgt}`` (all gold sentences) into ``workdir``.
    Raises AlignerError naming file and line for unequal line counts, an empty gold sentence,
    a gold link outside its sentence pair or a ``|||`` token.
    """
    check_condition(bool(gold), "give at least one gold set (--gold)")
    sources: List[List[str]] = []
    targets: List[List[str]] = []
    dropped = 0
    for src_path, tgt_path in train:
        bitext = read_bitext(source=src_path, target=tgt_path)
        for line_no, (src, tgt) in enumerate(zip(bitext.source, bitext.target), start=1):
            if train_limit is not None and len(sources) >= train_limit:
                break
            _check_no_separator(src, src_path, line_no)
            _check_no_separator(tgt, tgt_path, line_no)
            if not src or not tgt:
                dropped += 1
                continue
            sources.append(src)
            targets.append(tgt)
    n_train = len(sources)
    # the shared --gold reader: names, files, line counts, links, no empty sentence
    gold_sets = load_gold_sets(gold, allow_empty=False)
    for gold_set in gold_sets:
        for line_no, (src, tgt) in enumerate(zip(gold_set.sources, gold_set.targets),
                                             start=1):
            _check_no_separator(src, gold_set.source, line_no)
            _check_no_separator(tgt, gold_set.target, line_no)
        gold_set.offset = len(sources)
        sources.extend(gold_set.sources)
        targets.extend(gold_set.targets)
    paths = {suffix: os.path.join(workdir, f"corpus.{suffix}") for suffix in ("src", "tgt",
                                                                              "joint")}
    gold_paths = {suffix: os.path.join(workdir, f"gold.{suffix}") for suffix in ("src", "tgt")}
    with atomic_output(paths["src"]) as src_out, atomic_output(paths["tgt"]) as tgt_out, \
            atomic_output(paths["joint"]) as joint_out:
        for src, tgt in zip(sources, targets):
            src_out.write(" ".join(src) + "\n")
            tgt_out.write(" ".join(tgt) + "\n")
            joint_out.write(" ".join(src) + " ||| " + " ".join(tgt) + "\n")
    with atomic_output(gold_paths["src"]) as src_out, atomic_output(gold_paths["tgt"]) as tgt_out:
        for src, tgt in zip(sources[n_train:], targets[n_train:]):
            src_out.write(" ".join(src) + "\n")
            tgt_out.write(" ".join(tgt) + "\n")
    return Corpus(paths["src"], paths["tgt"], paths["joint"], gold_paths["src"],
                  gold_paths["tgt"], sources, targets, n_train, dropped, gold_sets)


@dataclass
class Measurement:
    """Cost of one child process: wall seconds, peak resident set size (KiB), exit status."""

    wall_s: float
    peak_kib: int
    returncode: int


# The measured command runs under this small launcher. Linux keeps a process's peak resident
# set across exec, and a child forked from this (large) process starts with our own peak, so
# measuring our direct child would report at least our own size. The launcher is a fresh small
# Python; the peak it reports (os.wait4 on ITS child) is that of the command and of the
# descendants the command waited for, with the launcher's own few MiB as a floor.
_LAUNCHER = """
import json, os, subprocess, sys, time
result, argv = sys.argv[1], sys.argv[2:]
start = time.perf_counter()
try:
    process = subprocess.Popen(argv)
except OSError as error:
    print(f"cannot start {argv[0]}: {error}", file=sys.stderr)
    status, peak = 127, 0
else:
    _, raw, usage = os.wait4(process.pid, 0)
    status, peak = os.waitstatus_to_exitcode(raw), usage.ru_maxrss
with open(result, "w") as handle:
    json.dump({"wall_s": time.perf_counter() - start, "peak_kib": peak, "status": status}, handle)
"""


def run_measured(argv: Sequence[str], log_path: str, stdout_path: Optional[str] = None,
                 cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None
                 ) -> Measurement:
    """Run ``argv`` in a child process (environment ``env``, default ours); measure its wall
    time and peak memory (also eval/bench_extract.py's measurement).

    stderr (and stdout, unless ``stdout_path`` is given) go to ``log_path``. The peak is
    ``ru_maxrss`` (KiB on Linux) from ``os.wait4`` on the command: the largest resident set of
    the command or of a descendant it waited for (see ``_LAUNCHER``).
    """
    with tempfile.NamedTemporaryFile("r", suffix=".json") as result, \
            open(log_path, "ab") as log:
        out = open(stdout_path, "wb") if stdout_path else log  # noqa: SIM115
        try:
            launcher = subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, result.name,
                                       *argv], stdout=out, stderr=log, cwd=cwd, env=env,
                                      check=False)
        finally:
            if stdout_path:
                out.close()
        text = result.read()
    if not text:  # the launcher itself was killed (e.g. out of memory): no measurement
        return Measurement(0.0, 0, launcher.returncode or 1)
    measured = json.loads(text)
    return Measurement(measured["wall_s"], int(measured["peak_kib"]), measured["status"])


@dataclass
class SystemResult:
    """One row group of the table: a system's cost and scores per gold set and column."""

    label: str
    version: str = ""
    settings: str = ""
    wall_s: float = 0.0
    peak_kib: int = 0
    status: str = "ok"  # "ok", "not run: ...", "failed: ..."
    training_s: Optional[float] = None  # pre-trained model: recorded training, in wall_s
    scores: Dict[str, Dict[str, AERScore]] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)


def read_directions(run: peers.PeerRun, corpus: Corpus
                    ) -> Tuple[List[Set[Link]], List[Set[Link]]]:
    """The forward and reverse links of the gold lines, checked against the sentences.

    Output files cover corpus lines ``run.first_line``.. to the end; each must have exactly
    that many lines, and every link must lie inside its sentence pair (catches a direction
    written target–source).
    """
    expected = len(corpus) - run.first_line
    result = []
    for path in (run.forward, run.reverse):
        links = read_pharaoh(path)
        check_condition(len(links) == expected, f"{path}: {len(links)} lines, expected "
                                                f"{expected} (corpus lines {run.first_line + 1}"
                                                f"..{len(corpus)})")
        tail = links[corpus.first_gold_line - run.first_line:]
        for k, sentence in enumerate(tail):
            line = corpus.first_gold_line + k
            check_links_in_range(sentence, len(corpus.sources[line]), len(corpus.targets[line]),
                                 path, line - run.first_line + 1)
        result.append(tail)
    return result[0], result[1]


def score_directions(forward: Sequence[Set[Link]], reverse: Sequence[Set[Link]],
                     corpus: Corpus, workdir: Optional[str] = None,
                     heuristics: Sequence[str] = HEURISTICS
                     ) -> Dict[str, Dict[str, AERScore]]:
    """Scores per gold set and column (fwd, rev, then each of ``heuristics``).

    ``forward``/``reverse`` hold the links of all gold lines (source–target), in corpus order.
    With ``workdir``, each column's links of each gold set are written there as
    ``NAME.COLUMN.txt`` (Pharaoh) for inspection.
    """
    scores: Dict[str, Dict[str, AERScore]] = {}
    for gold_set in corpus.gold_sets:
        start = gold_set.offset - corpus.first_gold_line
        fwd = list(forward[start:start + gold_set.size])
        rev = list(reverse[start:start + gold_set.size])
        columns = {"fwd": fwd, "rev": rev}
        for heuristic in heuristics:
            columns[heuristic] = [symmetrize(f, r, heuristic) for f, r in zip(fwd, rev)]
        scores[gold_set.name] = {name: score_aer(links, gold_set.golds)
                                 for name, links in columns.items()}
        if workdir:
            for name, links in columns.items():
                write_pharaoh(os.path.join(workdir, f"{gold_set.name}.{name}.txt"), links)
    return scores


def plan_aligner(kind: str, method: str, corpus: Corpus, workdir: str,
                 train_args: Sequence[str], extract_args: Sequence[str]) -> peers.PeerRun:
    """``align train`` of ``kind`` on the corpus, ``align extract`` of both directions.

    The model is trained once per kind (folder ``workdir/../aligner-KIND.model``, shared by
    the methods of that kind); extraction runs on the gold sentences only.
    """
    model = os.path.join(os.path.dirname(workdir), f"aligner-{kind}.model")
    forward = os.path.join(workdir, "fwd.txt")
    reverse = os.path.join(workdir, "rev.txt")
    train = peers.Step("train", ["align", "train", "--model", kind, "-s", corpus.source,
                                 "-t", corpus.target, "-o", model, "--overwrite", *train_args])
    steps = [train]
    for direction, path in (("fwd", forward), ("rev", reverse)):
        steps.append(peers.Step(f"extract-{direction}", [
            "align", "extract", model, "--method", method, "--direction", direction,
            "-s", corpus.gold_source, "-t", corpus.gold_target, "-o", path, *extract_args]))
    soft_step, soft_path = _soft_average_step(model, method, corpus, workdir, extract_args)
    steps.append(soft_step)
    return peers.PeerRun(label=f"align {kind}:{method}", version=f"aligner {aligner_version}",
                         settings=f"train: {' '.join(train_args) or 'defaults'}; "
                                  f"extract: {' '.join(extract_args) or 'defaults'}",
                         steps=steps, forward=forward, reverse=reverse,
                         first_line=corpus.first_gold_line,
                         symmetrized={SOFT_COLUMN: soft_path})


def _soft_average_step(model_dir: str, method: str, corpus: Corpus, workdir: str,
                       extract_args: Sequence[str]) -> Tuple[peers.Step, str]:
    """``align extract --direction both -H soft-average`` of the gold sentences."""
    path = os.path.join(workdir, f"{SOFT_COLUMN}.txt")
    return peers.Step(f"extract-{SOFT_COLUMN}", [
        "align", "extract", model_dir, "--method", method, "--direction", "both",
        "-H", SOFT_COLUMN, "-s", corpus.gold_source, "-t", corpus.gold_target, "-o", path,
        *extract_args]), path


def run_system(run: peers.PeerRun, corpus: Corpus, workdir: str,
               cache: Dict[Tuple[str, ...], Measurement],
               heuristics: Sequence[str] = HEURISTICS) -> SystemResult:
    """Run the steps of one system (a step already in ``cache`` is not rerun), then score."""
    result = SystemResult(run.label, run.version, run.settings, notes=list(run.notes))
    log_path = os.path.join(workdir, "log.txt")
    agreement = os.path.join(workdir, peers.AGREEMENT)
    if os.path.exists(agreement):  # left by an earlier run in the same folder
        os.unlink(agreement)
    for step in run.steps:
        key = tuple(step.argv)
        if key in cache:
            measurement = cache[key]
            result.notes.append(f"{step.name} shared with an earlier row "
                                f"({measurement.wall_s:.1f} s counted again)")
        else:
            click.echo(f"[{run.label}] {step.name}: {shlex.join(step.argv)}", err=True)
            measurement = run_measured(step.argv, log_path, step.stdout)
            cache[key] = measurement
        result.wall_s += measurement.wall_s
        result.peak_kib = max(result.peak_kib, measurement.peak_kib)
        if measurement.returncode != 0:
            result.status = (f"failed: {step.name} exited with status {measurement.returncode} "
                             f"(log: {log_path})")
            return result
    try:
        forward, reverse = read_directions(run, corpus)
    except AlignerError as error:
        result.status = f"failed: {error}"
        return result
    result.scores = score_directions(forward, reverse, corpus, workdir, heuristics)
    try:
        for column, path in run.symmetrized.items():
            score_symmetrized(column, path, run.first_line, corpus, result.scores)
    except AlignerError as error:
        result.status = f"failed: {error}"
        return result
    if os.path.exists(agreement):
        with open(agreement, encoding="utf-8") as handle:
            agree, total = handle.read().split()
        result.notes.append(f"directions decoded from systran-align's tables; their "
                            f"grow-diag-final-and equals the package's own output on "
                            f"{agree} of {total} gold sentence pairs")
        package = read_pharaoh(os.path.join(workdir, peers.PACKAGE_GDFA))
        for gold_set in corpus.gold_sets:
            start = gold_set.offset - run.first_line
            score = score_aer(package[start:start + gold_set.size], gold_set.golds)
            result.notes.append(f"the package's own grow-diag-final-and output scores "
                                f"{format_score(score)} on {gold_set.name}")
    return result


def score_symmetrized(column: str, path: str, first_line: int, corpus: Corpus,
                      scores: Dict[str, Dict[str, AERScore]]) -> None:
    """Score a system's own symmetrized links (Pharaoh ``path`` from corpus line
    ``first_line`` to the end) on every gold set into ``scores[gold set][column]``."""
    links = read_pharaoh(path)
    expected = len(corpus) - first_line
    check_condition(len(links) == expected, f"{path}: {len(links)} lines, expected {expected}")
    for gold_set in corpus.gold_sets:
        start = gold_set.offset - first_line
        for k in range(gold_set.size):
            line = gold_set.offset + k
            check_links_in_range(links[start + k], len(corpus.sources[line]),
                                 len(corpus.targets[line]), path, start + k + 1)
        scores[gold_set.name][column] = score_aer(links[start:start + gold_set.size],
                                                  gold_set.golds)


def format_score(score: AERScore) -> str:
    """``"AER (P/R)"`` in percent with one decimal, e.g. ``"8.7 (93.1/89.6)"``."""
    return f"{100 * score.aer:.1f} ({100 * score.precision:.1f}/{100 * score.recall:.1f})"


def render_table(results: Sequence[SystemResult], corpus: Corpus, title: str,
                 command: str, environment: Dict[str, str],
                 heuristics: Sequence[str] = HEURISTICS) -> str:
    """The Markdown report: command, set-up, one table per gold set, notes."""
    columns = DIRECTIONS + tuple(heuristics) + (SOFT_COLUMN,)
    lines = [f"# Aligner comparison: {title}", "",
             "Produced by `eval/compare_aligners.py` (see eval/README.md). Command:", "",
             "```", command, "```", ""]
    lines += [f"- {key}: {value}" for key, value in environment.items()]
    lines += [f"- corpus: {corpus.n_train} training pairs"
              + (f" ({corpus.n_dropped} with an empty side left out)" if corpus.n_dropped else "")
              + " + " + " + ".join(f"{g.size} {g.name}" for g in corpus.gold_sets)
              + f" = {len(corpus)} lines; every system trains on all of them",
              "- cells: AER % (precision % / recall %), corpus-level counts "
              "(Och & Ney; `aligner.links.metrics.score_aer`); fwd = p(target|source), "
              "rev = p(source|target), symmetrized by `aligner.links.symmetrize`; soft-average "
              "(`align` rows only: peers give no probabilities) = `align extract -H "
              "soft-average`, links where the mean of the two directions' word-level "
              "probabilities exceeds the threshold (`aligner.links.soft_symmetrize`): 0.5, or the "
              "one `align run` or a self-training `align train` recorded in its model "
              "directory (0.55 for their default)",
              "- time: wall seconds of the system's commands (training and alignment of the "
              "whole corpus, or training plus extraction of the gold lines); peak: largest "
              "resident set of one process (MiB)"]
    if any(result.training_s is not None for result in results):
        lines.append("- pre-trained `align` rows (`--aligner-model`): time = training seconds "
                     "recorded in the model directory (run.json; metrics.tsv before run "
                     "records) + extraction "
                     "measured here; peak = extraction only (see the notes under Systems)")
    lines.append("")
    for gold_set in corpus.gold_sets:
        lines += [f"## {gold_set.name}: {gold_set.gold_path} ({gold_set.size} sentence pairs, "
                  f"corpus lines {gold_set.offset + 1}-{gold_set.offset + gold_set.size})", "",
                  "| system | " + " | ".join(columns) + " | time s | peak MiB |",
                  "|---" * (len(columns) + 1) + "|---:|---:|"]
        for result in results:
            if result.status != "ok":
                lines.append(f"| {result.label} | {result.status} |" + " |" * (len(columns) + 1))
                continue
            cells = [format_score(result.scores[gold_set.name][c])
                     if c in result.scores[gold_set.name] else "–" for c in columns]
            lines.append(f"| {result.label} | " + " | ".join(cells)
                         + f" | {result.wall_s:.1f} | {result.peak_kib / 1024:.0f} |")
        lines.append("")
    lines += ["## Systems", ""]
    for result in results:
        lines.append(f"- **{result.label}**: {result.version}; {result.settings}".rstrip("; "))
        lines += [f"  - {note}" for note in result.notes]
    return "\n".join(lines) + "\n"


def results_json(results: Sequence[SystemResult], corpus: Corpus) -> Dict:
    """Machine-readable form of the results (for other scripts)."""
    return {
        "corpus_lines": len(corpus), "train_pairs": corpus.n_train,
        "gold_sets": {g.name: {"path": g.gold_path, "offset": g.offset, "size": g.size}
                      for g in corpus.gold_sets},
        "systems": [{"label": r.label, "version": r.version, "settings": r.settings,
                     "status": r.status, "wall_s": r.wall_s, "training_s": r.training_s,
                     "peak_kib": r.peak_kib,
                     "scores": {g: {c: s.as_dict() for c, s in cols.items()}
                                for g, cols in r.scores.items()},
                     "notes": r.notes} for r in results],
    }


def environment_summary() -> Dict[str, str]:
    """Date, machine and versions, for the report header."""
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{os.cpu_count()} CPU cores ({cpu}), Python {platform.python_version()}",
            "load average (1, 5, 15 min)": f"{load_average()} at start",
            "aligner": aligner_version}


def load_average() -> str:
    """The system load averages as ``"1.0/0.8/0.5"`` (timings are comparable only when low)."""
    return "/".join(f"{value:.1f}" for value in os.getloadavg())



# ------------------------------------------------------------------------------------------
# Pre-trained `align` models (--aligner-model): no training, extraction only; the training
# time recorded in the model directory is added, and the training text is checked.


@dataclass
class ModelSpec:
    """``--aligner-model [LABEL=]DIR:METHOD[,KEY=VALUE...]``: an existing model directory, a
    method and its options (``align extract -O KEY=VALUE``)."""

    model_dir: str
    method: str
    label: Optional[str] = None
    options: Tuple[str, ...] = ()

    @property
    def method_label(self) -> str:
        """The method and its options as a row shows them, e.g. ``attention layer=1``."""
        return " ".join((self.method,) + self.options)


def parse_model_spec(spec: str) -> ModelSpec:
    """``DIR:METHOD`` or ``LABEL=DIR:METHOD``, the method after the LAST colon, optionally
    followed by method options ``,KEY=VALUE`` (``runs/m:layer-sgd,init=random,sgd_lr=0.1``:
    `align extract --method layer-sgd -O init=random -O sgd_lr=0.1`).

    A prefix before the first ``=`` is a label unless it contains a path separator or the rest
    has no colon (then the ``=`` is a method option's), so ``runs/a=b:m`` is the directory
    ``runs/a=b`` and ``m:attention,layer=1`` has no label; a directory whose name contains
    ``=`` and no ``/`` needs an explicit label (``LABEL=a=b:m``). Option keys are checked
    as `align extract -O` checks them.
    """
    from aligner.cli.extract import method_options

    label: Optional[str] = None
    rest = spec
    head, sep, tail = spec.partition("=")
    if sep and head and "/" not in head and os.sep not in head and ":" in tail:
        label, rest = head, tail
    model_dir, sep, method = rest.rpartition(":")
    method, *options = method.split(",")
    check_condition(bool(sep and model_dir and method),
                    f"--aligner-model '{spec}': expected DIR:METHOD or LABEL=DIR:METHOD, "
                    "e.g. runs/enfr-hmm1:hmm-posterior")
    try:
        method_options(options, option=f"--aligner-model '{spec}': method option")
    except AlignerError as error:
        raise AlignerError(f"{error} (expected DIR:METHOD,KEY=VALUE,...)") from None
    return ModelSpec(model_dir, method, label, tuple(options))


def last_elapsed_seconds(path: str) -> float:
    """``elapsed_s`` of the last row of a ``metrics.tsv`` (read by
    aligner.training.loop.read_metrics).

    That column is the direction's training seconds up to that checkpoint, summed over
    resumed runs (validation included; BPE learning and corpus encoding not). AlignerError
    naming file and line when the file is not a metrics table or its last row has no number.
    """
    from aligner.training.loop import read_metrics

    rows = read_metrics(path)
    check_condition(bool(rows), f"{path}: no checkpoint rows (the training never checkpointed)")
    elapsed = rows[-1]["elapsed_s"]
    check_condition(elapsed is not None, f"{path}:{len(rows) + 1}: elapsed_s is not a number")
    return elapsed


@dataclass
class TrainingRecord:
    """Training seconds recorded in a model directory, and where each number came from.

    ``seconds`` maps a part to wall seconds: ``preparation`` (BPE, vocabularies, corpus
    encoding), ``teacher`` (the classical teacher that guides round 1, aligner/training/teacher.py),
    ``training`` (every direction's training, the directions trained side by side counting as
    the longest), ``guides`` (a self-training run's alignments of the bitext for the next
    round), each over every round and session of the run record; without a run record
    ``fwd``, ``rev`` or ``fwd+rev`` (metrics.tsv); a base model's parts (alignment layer) are
    prefixed ``base``. ``notes`` say where they were read and what is not known.
    """

    seconds: Dict[str, float] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def recorded_training(model_dir: str, directions: Sequence[str] = DIRECTIONS,
                      base_dir: Optional[str] = None) -> TrainingRecord:
    """The training time a model directory records, and for a model trained on a frozen base
    (alignment layer) its `base_dir`'s too.

    From the run record (MODEL_DIR/run.json, aligner/training/run_record.py): every stage of every
    session and self-training round. A directory without one (trained by a version before run
    records) gets one note saying so and the one cheap fallback: the last ``elapsed_s`` of
    each direction's metrics.tsv (:func:`last_elapsed_seconds`), the training loops of the last
    round only (preparation, earlier rounds and their guides are not known, not counted).
    AlignerError (one line naming the file) for a damaged run record or metrics.tsv.
    """
    from aligner.training.run_record import record_path

    record = TrainingRecord()
    folders = [("", model_dir)] + ([("base ", base_dir)] if base_dir else [])
    for prefix, folder in folders:
        if os.path.isfile(record_path(folder)):
            _add_run_record(record, prefix, folder, directions)
        else:
            record.notes.append(f"{folder} has no {C.RUN_RECORD_NAME} (trained before run "
                                "records): its time is the training loops' of metrics.tsv "
                                "only; BPE and corpus encoding, earlier self-training rounds "
                                "and their guides are unknown, not counted")
            _add_metrics(record, prefix, folder, directions)
    return record


def _add_run_record(record: TrainingRecord, prefix: str, folder: str,
                    directions: Sequence[str]) -> None:
    """Count the stages of FOLDER/run.json (directions it records no training of: their
    metrics.tsv, as a directory joined from two one-direction runs has)."""
    from aligner.training.run_record import RunRecord, record_path

    run = RunRecord.load(folder)
    path = record_path(folder)
    parts = {"preparation": 0.0, "teacher": 0.0, "training": 0.0, "guides": 0.0}
    per_direction: Dict[str, float] = {}
    side_by_side: Dict[Tuple[int, int], float] = {}
    for stage in run.stages:
        seconds = stage["seconds"]
        if stage["stage"] == "training":
            direction = stage.get("direction", "?")
            per_direction[direction] = per_direction.get(direction, 0.0) + seconds
            if stage.get("parallel"):
                key = (stage["session"], stage["round"])
                side_by_side[key] = max(side_by_side.get(key, 0.0), seconds)
            else:
                parts["training"] += seconds
        elif stage["stage"] in ("preparation", "teacher"):
            parts[stage["stage"]] += seconds
        else:
            parts["guides"] += seconds
    parts["training"] += sum(side_by_side.values())
    for part, seconds in parts.items():
        if seconds or part == "training":
            record.seconds[prefix + part] = seconds
    rounds = sorted({stage["round"] for stage in run.stages})
    loops = ", ".join(f"{d} {s:.1f} s" for d, s in per_direction.items())
    record.notes.append(
        ("trained beforehand" if not prefix else f"its base model {folder} trained beforehand")
        + f" ({path}): training {parts['training']:.1f} s ({loops or 'no direction'}"
        + ("; directions trained side by side in separate processes: the longer counts"
           if side_by_side else "") + f"), BPE and corpus encoding {parts['preparation']:.1f} s"
        + (f", the classical teacher {parts['teacher']:.1f} s" if parts["teacher"] else "")
        + (f", alignment of the bitext for the next round's guide {parts['guides']:.1f} s, "
           f"over self-training rounds {rounds[0]}-{rounds[-1]}" if len(rounds) > 1 else "")
        + (f"; {len(run.sessions)} sessions (resumed {len(run.sessions) - 1} times)"
           if len(run.sessions) > 1 else "") + "; counted into the time column")
    if run.earlier_unrecorded:
        record.notes.append(f"{path}: the run began with a version before run records; the "
                            "time of its sessions before the first recorded one is not counted")
    covered = {d for direction in per_direction for d in direction.split("+")}
    others = [d for d in directions if d not in covered]
    if others:
        record.notes.append(f"{path} records no {' or '.join(others)} training: trained by "
                            "another run (a joined directory), counted from metrics.tsv")
        _add_metrics(record, prefix, folder, others)


def _add_metrics(record: TrainingRecord, prefix: str, folder: str,
                 directions: Sequence[str]) -> None:
    """Count the last elapsed_s of each direction's metrics.tsv in `folder` (of joint/ for
    both directions trained together, agreement); a missing file is said, not guessed."""
    from aligner.model_dir import JOINT_DIR, direction_dir

    joint = os.path.join(folder, JOINT_DIR, C.METRICS_NAME)
    if os.path.isfile(joint):   # agreement training: both directions in one loop
        paths = {"+".join(DIRECTIONS): joint}
    else:
        paths = {d: os.path.join(direction_dir(folder, d), C.METRICS_NAME) for d in directions}
    for part, path in paths.items():
        if os.path.isfile(path):
            record.seconds[prefix + part] = last_elapsed_seconds(path)
            record.notes.append(f"{prefix}{part} {record.seconds[prefix + part]:.1f} s (elapsed_s "
                                f"of the last row of {path}); counted into the time column")
        else:
            record.notes.append(f"training time unknown: {path} is missing (0 s counted)")



def describe_line(corpus: Corpus, line: int) -> str:
    """Where 0-based corpus line `line` comes from: a training pair or a gold set's line."""
    for gold_set in corpus.gold_sets:
        if gold_set.offset <= line < gold_set.offset + gold_set.size:
            return f"gold set '{gold_set.name}' line {line - gold_set.offset + 1}"
    return f"training pair {line + 1}"


def _corpus_size(corpus: Corpus) -> str:
    return (f"{len(corpus)} lines ({corpus.n_train} training pairs + "
            + " + ".join(f"{g.size} {g.name}" for g in corpus.gold_sets) + ")")


def _first_encoded_difference(trained: "EncodedCorpus", ours: "EncodedCorpus"
                              ) -> Optional[Tuple[int, str]]:
    """First 0-based input line where two EncodedCorpus differ, and how; None if equal.

    Both encode the same number of input lines; a line may be kept by one and skipped (length
    filter) by the other, or kept by both with different subword ids on one side.
    """
    import numpy as np

    kept_a, kept_b = trained.line_numbers, ours.line_numbers
    common = min(len(kept_a), len(kept_b))
    unequal = np.nonzero(kept_a[:common] != kept_b[:common])[0]
    first_kept = None
    if len(unequal):
        first_kept = int(min(kept_a[unequal[0]], kept_b[unequal[0]]))
    elif len(kept_a) != len(kept_b):
        first_kept = int((kept_a if len(kept_a) > common else kept_b)[common])
    limit = int(unequal[0]) if len(unequal) else common
    for k in range(limit):
        for side, a, b in (("source", trained.source(k), ours.source(k)),
                           ("target", trained.target(k), ours.target(k))):
            if not np.array_equal(a, b):
                return int(kept_a[k]), f"the {side} side differs"
    if first_kept is not None:
        return first_kept, "kept by the length filter in one and skipped in the other"
    return None


def _check_encoded_corpus(model_dir: str, folder: str, corpus: Corpus, scratch: str
                          ) -> Tuple[Optional[str], str]:
    """Compare the model's encoded training corpus with the benchmark corpus encoded by the
    model's own preprocessing (BPE codes, vocabularies, tokenization, length filter)."""
    from aligner.config import RunConfig
    from aligner.data import EncodedCorpus, encode_corpus
    from aligner.formats import Bitext
    from aligner.model_dir import config_path, load_preprocessing
    from aligner.training.corpus import tokenize_bitext

    trained = EncodedCorpus.open(folder)
    n_input = trained.stats.n_input if trained.stats else -1
    if n_input != len(corpus):
        return (f"{folder}: the model was trained on {n_input} lines, the benchmark corpus has "
                f"{_corpus_size(corpus)}"), ""
    config = RunConfig.load(config_path(model_dir))
    pre, src_vocab, tgt_vocab = load_preprocessing(model_dir)
    source, target = tokenize_bitext(pre, Bitext(corpus.sources, corpus.targets,
                                                 corpus.source, corpus.target))
    with tempfile.TemporaryDirectory(prefix="training-text-check.", dir=scratch) as tmp:
        encode_corpus(pre, src_vocab, tgt_vocab, source, target, tmp,
                      max_len=config.data.max_len, max_ratio=config.data.max_ratio)
        difference = _first_encoded_difference(trained, EncodedCorpus.open(tmp))
    if difference is not None:
        line, how = difference
        return (f"{folder}: line {line + 1} of the benchmark corpus ({describe_line(corpus, line)}"
                f") is not the model's training line {line + 1}: {how} (compared as subword ids "
                "of the model's own preprocessing)"), ""
    return None, (f"training text checked: the {_corpus_size(corpus)} of the benchmark corpus, "
                  f"encoded with the model's own BPE and vocabularies, equal its encoded "
                  f"training corpus ({folder}) line for line")


def _round_one_sample(model_dir: str, n_lines: int) -> Optional[List[int]]:
    """The 0-based lines of an `n_lines` corpus that round 1 of the self-training run in
    `model_dir` trains on when its rounds train on samples (``--round-pairs`` below the
    corpus: aligner/training/samples.py, with the run's seed and settings), else None."""
    from aligner.config import RunConfig
    from aligner.model_dir import config_path
    from aligner.training.samples import sample_lines

    settings = os.path.join(model_dir, C.ROUNDS_DIR, C.ROUND_SETTINGS)
    if not (os.path.isfile(settings) and os.path.isfile(config_path(model_dir))):
        return None
    try:
        with open(settings, encoding="utf-8") as handle:
            plan = json.load(handle)["settings"]
        round_pairs = int(plan["--round-pairs"])
        share = float(plan.get("--fine-tune-share", 1.0))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    seed = RunConfig.load(config_path(model_dir)).training.seed
    lines = sample_lines(n_lines, round_pairs, seed, 1, share)
    return None if lines is None else [int(k) for k in lines]


def _check_recorded_inputs(model_dir: str, corpus: Corpus) -> Tuple[Optional[str], str]:
    """Fallback for a directory without corpus/ (e.g. joined from two runs): the bitext its
    run record names (the first session's), by pair count and fingerprint (the sha256 of its
    words pair by pair, aligner.training.corpus.bitext_fingerprint)."""
    from aligner.formats import Bitext
    from aligner.training.corpus import bitext_fingerprint
    from aligner.training.run_record import RunRecord, record_path

    path = record_path(model_dir)
    if not os.path.isfile(path):
        return None, (f"training text not checked: {model_dir} has neither a corpus/ folder "
                      f"nor a run record ({C.RUN_RECORD_NAME})")
    run = RunRecord.load(model_dir)
    bitext = next((s["inputs"]["bitext"] for s in run.sessions
                   if s.get("inputs", {}).get("bitext")), None)
    if bitext is None:
        return None, f"training text not checked: {path} names no training text"
    # a self-training run whose rounds train on samples records round 1's
    lines = _round_one_sample(model_dir, len(corpus))
    if lines is not None and bitext.get("pairs") != len(lines):
        lines = None
    what = ("the benchmark corpus's" if lines is None else
            f"round 1's sample of the benchmark corpus, drawn as the run draws it "
            f"({len(lines)} of its lines)")
    if bitext.get("pairs") != len(corpus) and lines is None:
        return (f"{path}: the model was trained on {bitext.get('pairs')} sentence pairs, the "
                f"benchmark corpus has {_corpus_size(corpus)}"), ""
    if bitext.get("sha256") is None:
        return None, (f"training text not checked: {model_dir} has no corpus/ folder and {path} "
                      f"records no fingerprint; only the number of training pairs "
                      f"({bitext['pairs']}) equals {what}")
    sources, targets = corpus.sources, corpus.targets
    if lines is not None:
        sources, targets = [sources[k] for k in lines], [targets[k] for k in lines]
    ours = bitext_fingerprint(Bitext(sources, targets, corpus.source, corpus.target))
    if bitext["sha256"] != ours:
        sample = "" if lines is None else f" from {what}"
        return (f"{path}: the training text ({bitext.get('source')}) is not the benchmark "
                f"corpus: the sha256 of its words differs{sample} (same number of pairs)"), ""
    trained = {d for s in run.sessions for d in s.get("directions", ())}
    others = [d for d in DIRECTIONS if d not in trained]
    return None, (f"training text checked: the sha256 of the words of the training text that "
                  f"{path} records ({model_dir} has no corpus/ folder) equals {what} "
                  f"({_corpus_size(corpus)})"
                  + (f"; {path} records no {' or '.join(others)} run, whose training text is "
                     "not checked" if others else ""))


def check_training_text(model_dir: str, corpus: Corpus, scratch: str
                        ) -> Tuple[Optional[str], str]:
    """Was the model in `model_dir` trained on exactly the benchmark corpus, line for line?

    Returns (mismatch message or None, note saying what was checked). With ``DIR/corpus``
    (the encoded training corpus that ``align train`` keeps), every benchmark line is encoded
    with the model's own preprocessing and compared as subword ids, gold lines included;
    without it (a directory joined from two one-direction runs), the training text's
    fingerprint and pair count that ``DIR/run.json`` records; with neither, nothing is checked
    and the note says so.
    `scratch` is a folder for a temporary encoded copy.
    """
    from aligner.data import CORPUS_META
    from aligner.model_dir import CORPUS_DIR

    folder = os.path.join(model_dir, CORPUS_DIR)
    if os.path.isfile(os.path.join(folder, CORPUS_META)):
        return _check_encoded_corpus(model_dir, folder, corpus, scratch)
    return _check_recorded_inputs(model_dir, corpus)


@dataclass
class PretrainedModel:
    """A checked ``--aligner-model``: what to run, the recorded training, the text check."""

    spec: ModelSpec
    kind: str
    version: str
    training: TrainingRecord
    text_notes: List[str]
    mismatch: Optional[str] = None


def load_pretrained(spec: ModelSpec, corpus: Corpus, scratch: str,
                    allow_other_text: bool = False,
                    checked: Optional[Dict[str, Tuple[Optional[str], str]]] = None,
                    checkpoint: str = "best") -> PretrainedModel:
    """Check an ``--aligner-model`` before anything runs (AlignerError: one line).

    The directory must hold a complete model of both directions whose kind (config.json
    ``model_kind``) has the method; its training text must be the benchmark corpus (see
    :func:`check_training_text`) unless `allow_other_text`, which keeps the mismatch for a
    loud note. ``checked`` caches text checks by real path (several methods of one model).
    ``checkpoint``: the weights the extraction loads (`align extract --checkpoint`).
    """
    from aligner.config import RunConfig
    from aligner.model_dir import config_path, list_incomplete
    from aligner.models import METHODS_BY_KIND

    model_dir = spec.model_dir
    what = f"--aligner-model {model_dir}:{','.join((spec.method,) + spec.options)}"
    check_condition(os.path.isdir(model_dir), f"{what}: {model_dir} is not a directory")
    config_file = config_path(model_dir)
    check_condition(os.path.isfile(config_file),
                    f"{what}: {config_file} is missing (not a model directory)")
    config = RunConfig.load(config_file)
    missing = [d for d in DIRECTIONS if d not in config.directions]
    check_condition(not missing, f"{what}: the model was trained for "
                                 f"{', '.join(config.directions)} only; the table needs fwd and "
                                 "rev (join two one-direction runs into one directory)")
    incomplete = list_incomplete(model_dir, list(DIRECTIONS), checkpoint)
    check_condition(not incomplete, f"{what}: the model directory is incomplete "
                                    f"({', '.join(incomplete)} missing)")
    check_condition(config.model_kind in METHODS_BY_KIND,
                    f"{what}: unknown model kind '{config.model_kind}' in {config_file}")
    methods = METHODS_BY_KIND[config.model_kind]
    check_condition(spec.method in methods,
                    f"{what}: unknown method '{spec.method}' for a {config.model_kind} model "
                    f"(choose from {', '.join(methods)})")
    base_dir = config.extra.get("base")  # alignment layer: the frozen base model directory
    base = base_dir if base_dir and os.path.isdir(base_dir) else None
    training = recorded_training(model_dir, DIRECTIONS, base)
    if base_dir and base is None:
        training.notes.append(f"the base model {base_dir} is gone: its training time is unknown "
                              "and not counted, its training text not checked")
    checked = {} if checked is None else checked
    folders = [model_dir] + ([base] if base else [])
    mismatches, notes = [], []
    for folder in folders:  # an alignment layer's base must have seen the same text
        key = os.path.realpath(folder)
        if key not in checked:
            click.echo(f"checking the training text of {folder} against the benchmark corpus",
                       err=True)
            checked[key] = check_training_text(folder, corpus, scratch)
        found, note = checked[key]
        prefix = "" if folder == model_dir else f"base model {folder}: "
        if found is not None:
            mismatches.append(prefix + found)
        if note:
            notes.append(prefix + note)
    mismatch = "; ".join(mismatches) if mismatches else None
    check_condition(mismatch is None or allow_other_text,
                    f"{what}: not trained on the benchmark corpus: {mismatch} (the row would "
                    "not be comparable; --allow-other-training-text adds it with a warning)")
    version = ""
    version_file = os.path.join(model_dir, C.VERSION_NAME)
    if os.path.isfile(version_file):
        with open(version_file, encoding="utf-8") as handle:
            version = handle.read().strip()
    return PretrainedModel(spec, config.model_kind, version, training, notes, mismatch)


def plan_pretrained(model: PretrainedModel, corpus: Corpus, workdir: str,
                    extract_args: Sequence[str]) -> peers.PeerRun:
    """``align extract DIR --method METHOD --direction fwd|rev`` on the gold sentences."""
    spec = model.spec
    forward = os.path.join(workdir, "fwd.txt")
    reverse = os.path.join(workdir, "rev.txt")
    extract_args = [arg for option in spec.options for arg in ("-O", option)] + list(extract_args)
    steps = [peers.Step(f"extract-{direction}", [
        "align", "extract", spec.model_dir, "--method", spec.method, "--direction", direction,
        "-s", corpus.gold_source, "-t", corpus.gold_target, "-o", path, *extract_args])
        for direction, path in (("fwd", forward), ("rev", reverse))]
    soft_step, soft_path = _soft_average_step(spec.model_dir, spec.method, corpus, workdir,
                                              extract_args)
    steps.append(soft_step)
    label = spec.label or (f"align {model.kind}:{spec.method_label} "
                           f"(pre-trained {spec.model_dir})")
    notes = []
    if model.mismatch is not None:
        label += " [OTHER TRAINING TEXT]"
        notes.append(f"WARNING: NOT trained on the benchmark corpus ({model.mismatch}); added "
                     "with --allow-other-training-text, its scores are not comparable with the "
                     "other rows")
    notes.append(f"pre-trained model {spec.model_dir} ({model.kind}), not trained by this "
                 "benchmark; only `align extract` of the gold sentences ran here")
    notes += model.training.notes
    notes.append("peak memory is that of extraction only (a model directory does not record "
                 "the training's peak)")
    notes += model.text_notes
    return peers.PeerRun(label=label,
                         version=(f"model written by aligner {model.version or '?'}, extracted "
                                  f"with aligner {aligner_version}"),
                         settings=f"model: {spec.model_dir}; extract: "
                                  f"{' '.join(extract_args) or 'defaults'}",
                         steps=steps, forward=forward, reverse=reverse,
                         first_line=corpus.first_gold_line, notes=notes,
                         symmetrized={SOFT_COLUMN: soft_path})


def _split_method(spec: str) -> Tuple[str, str]:
    kind, sep, method = spec.partition(":")
    check_condition(bool(sep and kind and method),
                    f"--aligner-method '{spec}': expected KIND:METHOD, e.g. hmm0:hmm-posterior")
    return kind, method


def extract_checkpoint(extract_args: Sequence[str]) -> str:
    """The weights `align extract` loads with `extract_args`: the value of its last
    --checkpoint (``--checkpoint last`` or ``--checkpoint=last``; click takes the last), else
    "best", its default."""
    checkpoint = "best"
    for k, arg in enumerate(extract_args):
        if arg == "--checkpoint" and k + 1 < len(extract_args):
            checkpoint = extract_args[k + 1]
        elif arg.startswith("--checkpoint="):
            checkpoint = arg.split("=", 1)[1]
    return checkpoint


def compare(train: Sequence[Tuple[str, str]], gold: Sequence[Tuple[str, str, str, str]],
            peer_names: Sequence[str], aligner_methods: Sequence[str], workdir: str,
            train_limit: Optional[int] = None, aligner_train_args: Sequence[str] = (),
            aligner_extract_args: Sequence[str] = (),
            peer_args: Optional[Dict[str, Sequence[str]]] = None,
            aligner_models: Sequence[str] = (), allow_other_training_text: bool = False,
            heuristics: Sequence[str] = HEURISTICS) -> Tuple[Corpus, List[SystemResult]]:
    """Build the corpus in ``workdir``, run every system, return the scored results.

    ``peer_args`` maps a peer name to extra command-line arguments (see peers.plan_peer).
    ``aligner_models``: ``[LABEL=]DIR:METHOD`` specs of pre-trained model directories; all
    are checked (:func:`load_pretrained`) before any system runs. Their rows come last.
    ``heuristics``: the symmetrized columns (aligner.links.symmetrize's names).
    """
    unknown = [h for h in heuristics if h not in SYMMETRIZE_HEURISTICS]
    check_condition(not unknown, f"--heuristics: unknown heuristic(s) {', '.join(unknown)} "
                                 f"(expected some of {', '.join(SYMMETRIZE_HEURISTICS)})")
    for name in peer_names:
        check_condition(name in peers.ALL_PEERS, f"unknown peer '{name}' "
                                                 f"(expected {', '.join(peers.ALL_PEERS)})")
    methods = [_split_method(spec) for spec in aligner_methods]
    specs = [parse_model_spec(spec) for spec in aligner_models]
    os.makedirs(workdir, exist_ok=True)
    corpus = build_corpus(train, gold, workdir, train_limit)
    checked: Dict[str, Tuple[Optional[str], str]] = {}
    pretrained = [load_pretrained(spec, corpus, workdir, allow_other_training_text, checked,
                                  extract_checkpoint(aligner_extract_args)) for spec in specs]
    results: List[SystemResult] = []
    cache: Dict[Tuple[str, ...], Measurement] = {}
    for name in peer_names:
        reason = peers.unavailable_reason(name)
        if reason:
            click.echo(f"skipping {name}: {reason}", err=True)
            results.append(SystemResult(name, status=f"not run: {reason}"))
            continue
        folder = os.path.join(workdir, name)
        os.makedirs(folder, exist_ok=True)
        try:
            run = peers.plan_peer(name, corpus.source, corpus.target, corpus.joint,
                                  corpus.first_gold_line, folder, (peer_args or {}).get(name, ()))
        except ValueError as error:
            raise AlignerError(str(error)) from None
        results.append(run_system(run, corpus, folder, cache, heuristics))
    for kind, method in methods:
        folder = os.path.join(workdir, f"aligner-{kind}-{method}")
        os.makedirs(folder, exist_ok=True)
        run = plan_aligner(kind, method, corpus, folder, list(aligner_train_args),
                           list(aligner_extract_args))
        results.append(run_system(run, corpus, folder, cache, heuristics))
    for number, model in enumerate(pretrained, start=1):
        name = os.path.basename(os.path.normpath(model.spec.model_dir))
        folder = os.path.join(workdir, f"model{number}-{name}-{model.spec.method}"
                              + "".join(f"-{option}" for option in model.spec.options))
        os.makedirs(folder, exist_ok=True)
        result = run_system(plan_pretrained(model, corpus, folder, list(aligner_extract_args)),
                            corpus, folder, cache, heuristics)
        result.training_s = model.training.total
        result.wall_s += model.training.total
        results.append(result)
    return corpus, results


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--train", "train", nargs=2, multiple=True, required=True,
              type=click.Path(exists=True, dir_okay=False), metavar="SRC TGT",
              help="Training text, line-aligned source and target (repeat to concatenate).")
@gold_option(use="appended to the training text in the order given, scored apart")
@click.option("--peers", "peer_list", default=",".join(peers.PEER_NAMES), show_default=True,
              help=f"Comma-separated peers to run ('' for none; also "
                   f"{', '.join(peers.ALL_PEERS[len(peers.PEER_NAMES):])}).")
@click.option("--eflomal-args", default="", help="Extra arguments for eflomal-align "
                                                   "(default: none, its own settings).")
@click.option("--fast-align-args", default="", help="Extra arguments for a fast_align binary "
                                                     "(default: -d -o -v only).")
@click.option("--aligner-method", "aligner_methods", multiple=True, metavar="KIND:METHOD",
              help="Also run our aligner: `align train --model KIND`, `align extract --method "
                   "METHOD` (repeatable; one training per kind).")
@click.option("--aligner-model", "aligner_models", multiple=True,
              metavar="[LABEL=]DIR:METHOD[,KEY=VALUE...]",
              help="Also score an already trained model directory (both directions, trained "
                   "on this benchmark's corpus): `align extract DIR --method METHOD [-O "
                   "KEY=VALUE...]` only; time = recorded training time + extraction "
                   "(repeatable).")
@click.option("--allow-other-training-text", is_flag=True,
              help="Accept an --aligner-model whose training text is not the benchmark corpus "
                   "(its row is marked and not comparable).")
@click.option("--heuristics", default=",".join(HEURISTICS), show_default=True,
              help="Comma-separated symmetrization columns after fwd and rev (of "
                   f"{', '.join(SYMMETRIZE_HEURISTICS)}).")
@click.option("--aligner-train-args", default="", help="Extra arguments for `align train`.")
@click.option("--aligner-extract-args", default="",
              help="Extra arguments for `align extract` (also for --aligner-model rows).")
@click.option("--train-limit", type=click.IntRange(min=0), default=None,
              help="Use at most this many training pairs (from the start).")
@click.option("--title", default="benchmark", show_default=True, help="Heading of the report.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Folder for the corpus, system outputs and logs (default: a new temporary "
                   "folder, kept and named on stderr).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="-", show_default=True,
              help="Markdown report.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the results as JSON.")
def main(train, gold, peer_list, eflomal_args, fast_align_args, aligner_methods,
         aligner_models, allow_other_training_text, heuristics, aligner_train_args,
         aligner_extract_args, train_limit, title, workdir, output, json_path) -> None:
    """Run peers and `align` methods on one bitext and write one AER/time/memory table."""
    command = "python eval/compare_aligners.py " + shlex.join(sys.argv[1:])
    if workdir is None:
        workdir = tempfile.mkdtemp(prefix="compare_aligners.")
    click.echo(f"work folder: {workdir}", err=True)
    environment = environment_summary()
    try:
        peer_names = [name.strip() for name in peer_list.split(",") if name.strip()]
        heuristics = [name.strip() for name in heuristics.split(",") if name.strip()]
        corpus, results = compare(train, gold, peer_names, aligner_methods, workdir,
                                  train_limit, shlex.split(aligner_train_args),
                                  shlex.split(aligner_extract_args),
                                  {"eflomal": shlex.split(eflomal_args),
                                   "fast_align": shlex.split(fast_align_args),
                                   "fast_align-binary": shlex.split(fast_align_args)},
                                  aligner_models, allow_other_training_text, heuristics)
        environment["load average (1, 5, 15 min)"] += f", {load_average()} at end"
        report = render_table(results, corpus, title, command, environment, heuristics)
        with atomic_output(output) as handle:
            handle.write(report)
        if json_path:
            with atomic_output(json_path) as handle:
                json.dump(results_json(results, corpus), handle, indent=1)
                handle.write("\n")
    except AlignerError as error:
        click.echo(f"compare_aligners: error: {error}", err=True)
        sys.exit(1)
    failed = [r.label for r in results if r.status.startswith("failed")]
    if failed:
        click.echo(f"compare_aligners: failed: {', '.join(failed)} (see {workdir})", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()  # pylint: disable=no-value-for-parameter
