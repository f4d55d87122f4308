"""Side-by-side benchmark: eflomal, fast_align and `align` methods on one bitext, one table.

Set-up (the project's benchmark convention): every system trains on the training pairs with
the gold sets' sentences appended at the end, in the order given; the last lines (one block
per gold set) are then scored against each gold set. For every system the table gives AER,
precision and recall of the forward links (model p(target | source)), the reverse links
(p(source | target)), and their grow-diag and grow-diag-final-and symmetrizations, plus wall
time and peak memory. Symmetrization and scoring use the project's own library
(aligner.symmetrize, aligner.metrics), so every system is scored by the same code.

Each command of a system runs in its own child process; its wall time is measured around it
and its peak memory is the largest resident set size of the process and its waited-for
descendants (``os.wait4``; ``ru_maxrss``; see ``run_measured``). A system's time is the sum
over its commands, its peak the maximum.

Peers (``pip install -r eval/requirements-peers.txt``; see eval/peers.py) are optional: a
missing peer gets a "not run" row. Our own aligner runs as ``--aligner-method KIND:METHOD``
(``align train --model KIND`` once per kind, then ``align extract --method METHOD`` of each
direction on the gold sentences; time = training + extraction).

Example (en-fr, 25k training pairs, dev and trial scored separately)::

    python eval/compare_aligners.py --title "en-fr" \\
        --train ../shared/data/enfr/train.src ../shared/data/enfr/train.tgt \\
        --gold dev ../shared/data/enfr/dev.src ../shared/data/enfr/dev.tgt \\
                   ../shared/data/enfr/dev.talp \\
        --gold trial ../shared/data/enfr/trial.src ../shared/data/enfr/trial.tgt \\
                     ../shared/data/enfr/trial.talp \\
        --output eval/results/compare_enfr.md
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
from typing import Dict, List, Optional, Sequence, Set, Tuple

import click

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (eval/ is a recipe folder, not a package)

from aligner import __version__ as aligner_version  # noqa: E402
from aligner.formats import (GoldAlignment, check_links_in_range, check_same_length,  # noqa: E402
                             read_bitext, read_gold, read_pharaoh, write_pharaoh)
from aligner.metrics import AERScore, score_aer  # noqa: E402
from aligner.symmetrize import symmetrize  # noqa: E402
from aligner.utils import AlignerError, atomic_output, check_condition  # noqa: E402

Link = Tuple[int, int]
# Table columns: the two directions, then the symmetrizations computed from them.
DIRECTIONS = ("fwd", "rev")
HEURISTICS = ("grow-diag", "grow-diag-final-and")
COLUMNS = DIRECTIONS + HEURISTICS


@dataclass
class GoldSet:
    """One gold set, appended to the corpus at 0-based lines ``offset``..``offset + size - 1``."""

    name: str
    source: str
    target: str
    gold_path: str
    offset: int
    golds: List[GoldAlignment]

    @property
    def size(self) -> int:
        return len(self.golds)


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
    gold_sets = []
    names = set()
    for name, src_path, tgt_path, gold_path in gold:
        check_condition(name not in names, f"gold set name '{name}' given twice")
        names.add(name)
        bitext = read_bitext(source=src_path, target=tgt_path)
        golds = read_gold(gold_path)
        check_same_length(src_path, len(bitext), gold_path, len(golds))
        for line_no, (src, tgt, links) in enumerate(zip(bitext.source, bitext.target, golds),
                                                     start=1):
            check_condition(bool(src) and bool(tgt),
                            f"{src_path if not src else tgt_path}:{line_no}: empty gold "
                            "sentence (the peers cannot align it)")
            _check_no_separator(src, src_path, line_no)
            _check_no_separator(tgt, tgt_path, line_no)
            check_links_in_range(links.possible, len(src), len(tgt), gold_path, line_no)
        gold_sets.append(GoldSet(name, src_path, tgt_path, gold_path, len(sources), golds))
        sources.extend(bitext.source)
        targets.extend(bitext.target)
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
                 cwd: Optional[str] = None) -> Measurement:
    """Run ``argv`` in a child process; measure its wall time and peak memory.

    stderr (and stdout, unless ``stdout_path`` is given) go to ``log_path``. The peak is
    ``ru_maxrss`` (KiB on Linux) from ``os.wait4`` on the command: the largest resident set of
    the command or of a descendant it waited for (see ``_LAUNCHER``).
    """
    with tempfile.NamedTemporaryFile("r", suffix=".json") as result, \
            open(log_path, "ab") as log:
        out = open(stdout_path, "wb") if stdout_path else log  # noqa: SIM115
        try:
            launcher = subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, result.name,
                                       *argv], stdout=out, stderr=log, cwd=cwd, check=False)
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
                     corpus: Corpus, workdir: Optional[str] = None
                     ) -> Dict[str, Dict[str, AERScore]]:
    """Scores per gold set and column (fwd, rev, grow-diag, grow-diag-final-and).

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
        for heuristic in HEURISTICS:
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
    return peers.PeerRun(label=f"align {kind}:{method}", version=f"aligner {aligner_version}",
                         settings=f"train: {' '.join(train_args) or 'defaults'}; "
                                  f"extract: {' '.join(extract_args) or 'defaults'}",
                         steps=steps, forward=forward, reverse=reverse,
                         first_line=corpus.first_gold_line)


def run_system(run: peers.PeerRun, corpus: Corpus, workdir: str,
               cache: Dict[Tuple[str, ...], Measurement]) -> SystemResult:
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
    result.scores = score_directions(forward, reverse, corpus, workdir)
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


def format_score(score: AERScore) -> str:
    """``"AER (P/R)"`` in percent with one decimal, e.g. ``"8.7 (93.1/89.6)"``."""
    return f"{100 * score.aer:.1f} ({100 * score.precision:.1f}/{100 * score.recall:.1f})"


def render_table(results: Sequence[SystemResult], corpus: Corpus, title: str,
                 command: str, environment: Dict[str, str]) -> str:
    """The Markdown report: command, set-up, one table per gold set, notes."""
    lines = [f"# Aligner comparison: {title}", "",
             "Produced by `eval/compare_aligners.py` (see eval/README.md). Command:", "",
             "```", command, "```", ""]
    lines += [f"- {key}: {value}" for key, value in environment.items()]
    lines += [f"- corpus: {corpus.n_train} training pairs"
              + (f" ({corpus.n_dropped} with an empty side left out)" if corpus.n_dropped else "")
              + " + " + " + ".join(f"{g.size} {g.name}" for g in corpus.gold_sets)
              + f" = {len(corpus)} lines; every system trains on all of them",
              "- cells: AER % (precision % / recall %), corpus-level counts "
              "(Och & Ney; `aligner.metrics.score_aer`); fwd = p(target|source), "
              "rev = p(source|target), symmetrized by `aligner.symmetrize`",
              "- time: wall seconds of the system's commands (training and alignment of the "
              "whole corpus, or training plus extraction of the gold lines); peak: largest "
              "resident set of one process (MiB)", ""]
    for gold_set in corpus.gold_sets:
        lines += [f"## {gold_set.name}: {gold_set.gold_path} ({gold_set.size} sentence pairs, "
                  f"corpus lines {gold_set.offset + 1}-{gold_set.offset + gold_set.size})", "",
                  "| system | fwd | rev | grow-diag | grow-diag-final-and | time s | peak MiB |",
                  "|---|---|---|---|---|---:|---:|"]
        for result in results:
            if result.status != "ok":
                lines.append(f"| {result.label} | {result.status} | | | | | |")
                continue
            cells = [format_score(result.scores[gold_set.name][c]) for c in COLUMNS]
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
                     "status": r.status, "wall_s": r.wall_s, "peak_kib": r.peak_kib,
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


def _split_method(spec: str) -> Tuple[str, str]:
    kind, sep, method = spec.partition(":")
    check_condition(bool(sep and kind and method),
                    f"--aligner-method '{spec}': expected KIND:METHOD, e.g. hmm0:hmm-posterior")
    return kind, method


def compare(train: Sequence[Tuple[str, str]], gold: Sequence[Tuple[str, str, str, str]],
            peer_names: Sequence[str], aligner_methods: Sequence[str], workdir: str,
            train_limit: Optional[int] = None, aligner_train_args: Sequence[str] = (),
            aligner_extract_args: Sequence[str] = (),
            peer_args: Optional[Dict[str, Sequence[str]]] = None
            ) -> Tuple[Corpus, List[SystemResult]]:
    """Build the corpus in ``workdir``, run every system, return the scored results.

    ``peer_args`` maps a peer name to extra command-line arguments (see peers.plan_peer).
    """
    for name in peer_names:
        check_condition(name in peers.ALL_PEERS, f"unknown peer '{name}' "
                                                 f"(expected {', '.join(peers.ALL_PEERS)})")
    methods = [_split_method(spec) for spec in aligner_methods]
    os.makedirs(workdir, exist_ok=True)
    corpus = build_corpus(train, gold, workdir, train_limit)
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
        results.append(run_system(run, corpus, folder, cache))
    for kind, method in methods:
        folder = os.path.join(workdir, f"aligner-{kind}-{method}")
        os.makedirs(folder, exist_ok=True)
        run = plan_aligner(kind, method, corpus, folder, list(aligner_train_args),
                           list(aligner_extract_args))
        results.append(run_system(run, corpus, folder, cache))
    return corpus, results


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--train", "train", nargs=2, multiple=True, required=True,
              type=click.Path(exists=True, dir_okay=False), metavar="SRC TGT",
              help="Training text, line-aligned source and target (repeat to concatenate).")
@click.option("--gold", "gold", nargs=4, multiple=True, required=True,
              type=(str, click.Path(exists=True, dir_okay=False),
                    click.Path(exists=True, dir_okay=False),
                    click.Path(exists=True, dir_okay=False)),
              metavar="NAME SRC TGT GOLD",
              help="A gold set: name, its source and target sentences, its gold (talp: i-j "
                   "sure, ipj/i?j possible). Appended to the training text; repeatable.")
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
@click.option("--aligner-train-args", default="", help="Extra arguments for `align train`.")
@click.option("--aligner-extract-args", default="", help="Extra arguments for `align extract`.")
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
         aligner_train_args, aligner_extract_args, train_limit, title, workdir, output,
         json_path) -> None:
    """Run peers and `align` methods on one bitext and write one AER/time/memory table."""
    command = "python eval/compare_aligners.py " + shlex.join(sys.argv[1:])
    if workdir is None:
        workdir = tempfile.mkdtemp(prefix="compare_aligners.")
    click.echo(f"work folder: {workdir}", err=True)
    environment = environment_summary()
    try:
        peer_names = [name.strip() for name in peer_list.split(",") if name.strip()]
        corpus, results = compare(train, gold, peer_names, aligner_methods, workdir,
                                  train_limit, shlex.split(aligner_train_args),
                                  shlex.split(aligner_extract_args),
                                  {"eflomal": shlex.split(eflomal_args),
                                   "fast_align": shlex.split(fast_align_args),
                                   "fast_align-binary": shlex.split(fast_align_args)})
        environment["load average (1, 5, 15 min)"] += f", {load_average()} at end"
        report = render_table(results, corpus, title, command, environment)
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
