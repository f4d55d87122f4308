"""Benchmark: `align extract` throughput, peak memory and AER, for one or more code trees.

Runs the real command (``python -m aligner extract MODEL -s -t -m METHOD -H HEURISTIC``) in a
subprocess per measurement, with ``PYTHONPATH`` set to each code tree (e.g. the current
checkout and a ``git worktree`` of an older commit), interleaved tree by tree, and reports:

* throughput: wall time and sentence pairs/s on the first ``--pairs`` lines of a bitext;
* memory: peak resident set (``os.wait4`` ``ru_maxrss``, measured as eval/compare_aligners.py
  measures its commands: ``run_measured``) of the same run, and of one long
  sentence pair of ``--long-words`` words per side (consecutive lines of the bitext joined,
  so real text; the model's own length limit applies);
* quality: AER / precision / recall of the output on gold sets (``--gold NAME SRC TGT GOLD``,
  eval/gold_sets.py; scored by aligner.links.metrics.score_aer, as `align score-aer` scores),
  and the share of output lines identical to the first tree's.

Writes a markdown table (stdout or ``--output``). Example (eval/results/extract_speed.md)::

    git worktree add /tmp/before 0641c79
    python eval/bench_extract.py --model-dir runs/enfr-hmm1 \\
        --src /tmp/enfr/train.en --tgt /tmp/enfr/train.fr --pairs 2000 \\
        --tree before=/tmp/before --tree after=. --long-words 50,150,300 \\
        --gold enfr-dev $D/dev.src $D/dev.tgt $D/dev.talp --output eval/results/extract_speed.md
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_aligners import run_measured  # noqa: E402
from gold_sets import GoldSet, add_gold_argument, exit_on_error, load_gold_sets  # noqa: E402

MiB = 1024 * 1024


def run_extract(tree: str, model_dir: str, src: str, tgt: str, output: str, method: str,
                heuristic: str, threads: int, extra: List[str]) -> Tuple[float, float]:
    """Run `align extract` from code tree `tree`; returns (wall seconds, peak RSS MiB)."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    command = [sys.executable, "-m", "aligner", "extract", model_dir, "-s", src, "-t", tgt,
               "-m", method, "-H", heuristic, "-o", output, "--threads", str(threads),
               "--device", "cpu", "-q"] + extra
    with tempfile.NamedTemporaryFile("r", suffix=".log") as log:
        measured = run_measured(command, log.name, stdout_path=os.devnull,
                                cwd=tempfile.gettempdir(), env=env)
        if measured.returncode != 0:
            raise SystemExit(f"extract failed in {tree}: {log.read().strip()[-500:]}")
    return measured.wall_s, measured.peak_kib * 1024 / MiB


def head(path: str, count: int, out: str) -> None:
    with open(path, encoding="utf-8") as handle, open(out, "w", encoding="utf-8") as result:
        for k, line in enumerate(handle):
            if k >= count:
                break
            result.write(line)


def long_pair(src: str, tgt: str, words: int, out_src: str, out_tgt: str) -> Tuple[int, int]:
    """Join consecutive bitext lines until both sides have >= `words` words; cut to `words`."""
    src_words: List[str] = []
    tgt_words: List[str] = []
    with open(src, encoding="utf-8") as s, open(tgt, encoding="utf-8") as t:
        for line_s, line_t in zip(s, t):
            src_words += line_s.split()
            tgt_words += line_t.split()
            if len(src_words) >= words and len(tgt_words) >= words:
                break
    with open(out_src, "w", encoding="utf-8") as handle:
        handle.write(" ".join(src_words[:words]) + "\n")
    with open(out_tgt, "w", encoding="utf-8") as handle:
        handle.write(" ".join(tgt_words[:words]) + "\n")
    return len(src_words[:words]), len(tgt_words[:words])


def score(hypothesis: str, gold_set: GoldSet) -> Tuple[float, float, float]:
    """(AER, precision, recall) in % of a Pharaoh file against a gold set."""
    from aligner.formats import read_pharaoh
    from aligner.links.metrics import score_aer
    result = score_aer(read_pharaoh(hypothesis), gold_set.golds)
    return 100 * result.aer, 100 * result.precision, 100 * result.recall


def same_lines(a: str, b: str) -> float:
    with open(a, encoding="utf-8") as x, open(b, encoding="utf-8") as y:
        left, right = x.read().splitlines(), y.read().splitlines()
    return 100.0 * sum(p == q for p, q in zip(left, right)) / max(1, len(left))


@exit_on_error("bench_extract.py")
def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--src", required=True, help="bitext source side (throughput run)")
    parser.add_argument("--tgt", required=True)
    parser.add_argument("--pairs", type=int, default=2000, help="first N lines of the bitext")
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH[|ARGS]",
                        help="code tree to run, with optional extra extract arguments after "
                             "'|' (repeatable; the first is the reference)")
    parser.add_argument("--method", default="hmm-posterior")
    parser.add_argument("--heuristic", default="soft-average")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--long-words", default="50,150,300",
                        help="comma-separated lengths of the long-pair memory runs ('' = none)")
    add_gold_argument(parser, required=False, use="aligned alone by every tree")
    parser.add_argument("--extra", default="", help="further extract options for every tree")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    trees, tree_args = [], {}
    for spec in args.tree:
        name, rest = spec.split("=", 1)
        path, _, own = rest.partition("|")
        trees.append((name, path))
        tree_args[name] = own.split()
    extra = args.extra.split()
    gold_sets = load_gold_sets([(name, *(os.path.abspath(p) for p in paths))
                                for name, *paths in args.gold])
    work = tempfile.mkdtemp(prefix="bench_extract.")
    src, tgt = os.path.join(work, "src"), os.path.join(work, "tgt")
    args.model_dir = os.path.abspath(args.model_dir)
    head(args.src, args.pairs, src)
    head(args.tgt, args.pairs, tgt)

    rows = []
    outputs: Dict[str, str] = {}
    for name, tree in trees:
        out = os.path.join(work, f"{name}.corpus.txt")
        wall, peak = run_extract(tree, args.model_dir, src, tgt, out, args.method,
                                 args.heuristic, args.threads, extra + tree_args[name])
        outputs[name] = out
        rows.append((name, wall, args.pairs / wall, peak))
        print(f"{name}: {args.pairs} pairs in {wall:.1f} s, peak {peak:.0f} MiB",
              file=sys.stderr)
    reference = trees[0][0]
    lines = ["# `align extract` throughput, memory and AER by code tree", "",
             f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
             f"at the end {' / '.join(f'{x:.1f}' for x in os.getloadavg())}. Trees: "
             + "; ".join(f"`{n}` = {p}" + (f" with `{' '.join(tree_args[n])}`"
                                          if tree_args[n] else "") for n, p in trees) + ".", "",
             f"Model `{args.model_dir}`, `-m {args.method} -H {args.heuristic}`, "
             f"`--threads {args.threads}` {' '.join(extra)}, CPU "
             f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores).", "",
             f"## Throughput: first {args.pairs} lines of `{args.src}`", "",
             "| tree | wall s | pairs/s | speed-up | peak RSS MiB | lines identical to "
             f"{reference} |", "|---|---|---|---|---|---|"]
    for name, wall, rate, peak in rows:
        lines.append(f"| {name} | {wall:.1f} | {rate:.1f} | {rows[0][1] / wall:.2f}x | "
                     f"{peak:.0f} | {same_lines(outputs[reference], outputs[name]):.1f} % |")

    lengths = [int(n) for n in args.long_words.split(",") if n.strip()]
    if lengths:
        lines += ["", "## Peak RSS (MiB) of one long sentence pair (consecutive lines joined)",
                  "", "| words per side | " + " | ".join(n for n, _ in trees) + " |",
                  "|---|" + "---|" * len(trees)]
        for words in lengths:
            ls, lt = os.path.join(work, f"long{words}.src"), os.path.join(work, f"long{words}.tgt")
            long_pair(args.src, args.tgt, words, ls, lt)
            cells = []
            for name, tree in trees:
                wall, peak = run_extract(tree, args.model_dir, ls, lt,
                                         os.path.join(work, f"{name}.long.txt"), args.method,
                                         args.heuristic, args.threads, extra + tree_args[name])
                cells.append(f"{peak:.0f} ({wall:.1f} s)")
                print(f"{name}: {words} words, peak {peak:.0f} MiB", file=sys.stderr)
            lines.append(f"| {words} | " + " | ".join(cells) + " |")

    if gold_sets:
        lines += ["", "## AER on gold sets (same command)", "",
                  "| set | tree | AER | P | R | lines identical to " + reference + " |",
                  "|---|---|---|---|---|---|"]
        for gold_set in gold_sets:
            set_outputs = {}
            for name, tree in trees:
                out = os.path.join(work, f"{name}.{gold_set.name}.txt")
                run_extract(tree, args.model_dir, gold_set.source, gold_set.target, out,
                            args.method, args.heuristic, args.threads, extra + tree_args[name])
                set_outputs[name] = out
            for name, _ in trees:
                aer, precision, recall = score(set_outputs[name], gold_set)
                lines.append(f"| {gold_set.name} | {name} | {aer:.2f} | {precision:.1f} | "
                             f"{recall:.1f} | "
                             f"{same_lines(set_outputs[reference], set_outputs[name]):.1f} % |")

    lines += ["", "Command:", "", "```", "python eval/bench_extract.py " +
              shlex.join(argv if argv is not None else sys.argv[1:]), "```", ""]
    text = "\n".join(lines)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text)
    print(text)


if __name__ == "__main__":
    main()
