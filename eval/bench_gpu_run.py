"""Benchmark: the whole `align run` job on one GPU: wall time, GPU memory, stage times, AER.

Runs ``python -m aligner run`` once per ``--variant`` (its extra options; "" = the default
recipe with the device's defaults, aligner/training/recipe.py:device_defaults), one after the
other, on the same bitext, each in its own model directory under ``--workdir``. For each:

* wall seconds of the command, and its stages from MODEL_DIR/run.json (preparation, the
  classical teacher, each round's training per direction, each guide; the final alignment
  is the rest);
* the GPU memory in use on GPU 0, the most seen by ``nvidia-smi`` polled every 0.2 s (the
  job's CUDA context and its allocator's reserve included: what another job on the card can
  no longer have);
* AER / precision / recall of the lines of each ``--gold NAME SRC TGT GOLD`` (eval/gold_sets.py:
  its sentences are found among the bitext's lines; aligner.links.metrics.score_aer, as
  `align score-aer` scores them).

A variant still running at ``--deadline`` seconds from the start is stopped; its row keeps the
stages its run.json recorded. Prints a markdown table and writes ``--workdir``/gpu_run.json.
The en-fr 25k benchmark (eval/results/gpu_enfr.md)::

    cat ../shared/data/enfr/{train,dev,trial}.src > train.en    # likewise .tgt > train.fr
    python eval/bench_gpu_run.py --src train.en --tgt train.fr --workdir runs/gpu \\
        --gold dev ../shared/data/enfr/dev.{src,tgt,talp} \\
        --gold trial ../shared/data/enfr/trial.{src,tgt,talp} \\
        --variant "" --variant "--max-tokens 12000 --lr 6e-3 --warmup 15" --deadline 560
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gold_sets import (GoldSet, add_gold_argument, exit_on_error, load_gold_sets,  # noqa: E402
                       locate)

from aligner.formats import read_bitext, read_pharaoh  # noqa: E402
from aligner.links.metrics import score_aer  # noqa: E402
from aligner.training.run_record import RunRecord  # noqa: E402
from aligner.utils import AlignerError  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def align(*args: str, timeout: Optional[float] = None) -> subprocess.CompletedProcess:
    """`python -m aligner ARGS` of this checkout."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "aligner", *args], env=env, timeout=timeout,
                          capture_output=True, text=True)


class GpuMemoryPoll:
    """The most GPU memory in use (MiB, all processes on GPU 0) seen while running."""

    def __init__(self, interval: float = 0.2):
        self.interval, self.peak_mib, self._stop = interval, 0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                                      "--format=csv,noheader,nounits", "-i", "0"],
                                     capture_output=True, text=True, timeout=10).stdout
                self.peak_mib = max(self.peak_mib, int(out.split()[0]))
            except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
                pass
            self._stop.wait(self.interval)

    def __enter__(self) -> "GpuMemoryPoll":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def score(alignments: str, gold_set: GoldSet) -> Dict:
    """AER, precision, recall (fractions) and link counts of the gold set's lines of
    `alignments` (a Pharaoh file of the whole bitext; the set located by gold_sets.locate)."""
    links = read_pharaoh(alignments)[gold_set.offset:gold_set.offset + gold_set.size]
    return score_aer(links, gold_set.golds).as_dict()


def run_variant(args, gold_sets: List[GoldSet], extra: str, index: int,
                deadline: float) -> Dict:
    model_dir = os.path.join(args.workdir, f"v{index}")
    output = model_dir + ".align"
    command = ["run", "-s", args.src, "-t", args.tgt, "-o", output, "--model-dir", model_dir,
               "--overwrite", *shlex.split(extra)]
    row: Dict = {"variant": extra or "(defaults)", "command": "align " + shlex.join(command)}
    start = time.time()
    with GpuMemoryPoll() as memory:
        try:
            done = align(*command, timeout=max(1.0, deadline - time.time()))
            row["returncode"] = done.returncode
            if done.returncode != 0:
                row["error"] = done.stderr.strip()[-1500:]
        except subprocess.TimeoutExpired:
            row["returncode"] = None
            row["error"] = "stopped at the deadline"
    row["wall_s"] = round(time.time() - start, 1)
    row["gpu_peak_mib"] = memory.peak_mib
    try:
        record = RunRecord.load(model_dir)
        row["stages"], row["recorded_s"] = record.stages, round(record.wall_seconds(), 1)
        row["device"] = record.sessions[-1].get("device")
        row["precision"] = record.sessions[-1].get("precision")
    except (AlignerError, IndexError):
        row["stages"], row["recorded_s"] = [], 0.0
    if row.get("returncode") == 0:
        for gold_set in gold_sets:
            row[gold_set.name] = score(output, gold_set)
    return row


#: the versions and the GPU, asked in a process of its own: a CUDA context in this process
#: would stay on the card and count in every variant's memory
ENVIRONMENT = """
import json, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    info["gpu"] = torch.cuda.get_device_name(0)
    info["capability"] = list(torch.cuda.get_device_capability(0))
    info["bf16"] = torch.cuda.is_bf16_supported()
print(json.dumps(info))
"""


def environment() -> Dict:
    done = subprocess.run([sys.executable, "-c", ENVIRONMENT], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-300:]}


def table(rows: List[Dict], names: List[str]) -> str:
    head = ["variant", "wall s", "GPU MiB", "train s", "teacher s", "guide s", "prep s",
            "rest s", *[f"{n} AER" for n in names]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        seconds = {kind: sum(s["seconds"] for s in row["stages"] if s["stage"] == kind)
                   for kind in ("teacher", "guide", "preparation")}
        # training: the recorded wall time (directions side by side count once) less the rest
        training = row["recorded_s"] - sum(seconds.values())
        aers = [f"{100 * row[n]['aer']:.2f}" if n in row else "-" for n in names]
        lines.append("| " + " | ".join([row["variant"], str(row["wall_s"]),
                                         str(row["gpu_peak_mib"]), f"{training:.1f}",
                                         f"{seconds['teacher']:.1f}",
                                         f"{seconds['guide']:.1f}",
                                         f"{seconds['preparation']:.1f}",
                                         f"{row['wall_s'] - row['recorded_s']:.1f}",
                                         *aers]) + " |")
    return "\n".join(lines)


@exit_on_error("bench_gpu_run.py")
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", required=True)
    parser.add_argument("--tgt", required=True)
    parser.add_argument("--workdir", required=True)
    add_gold_argument(parser, required=False,
                      use="found among the lines of --src/--tgt")
    parser.add_argument("--variant", action="append", default=None,
                        help='extra `align run` options of one run ("" = defaults)')
    parser.add_argument("--deadline", type=float, default=3600.0,
                        help="seconds from the start after which a running variant is stopped")
    args = parser.parse_args()
    gold_sets = load_gold_sets(args.gold)
    bitext = read_bitext(args.src, args.tgt)
    locate(gold_sets, bitext.source, bitext.target, f"{args.src}/{args.tgt}")
    del bitext
    os.makedirs(args.workdir, exist_ok=True)
    deadline = time.time() + args.deadline
    result = {"environment": environment(), "variants": []}
    print(json.dumps(result["environment"]), flush=True)
    for index, extra in enumerate(args.variant or [""]):
        if time.time() >= deadline:
            break
        row = run_variant(args, gold_sets, extra, index, deadline)
        result["variants"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "stages"}), flush=True)
        with open(os.path.join(args.workdir, "gpu_run.json"), "w", encoding="utf-8") as out:
            json.dump(result, out, indent=1)
    print(table(result["variants"], [gold_set.name for gold_set in gold_sets]))


if __name__ == "__main__":
    main()
