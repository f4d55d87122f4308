"""Benchmark: wall time of `align train` with the two directions one after the other vs at the
same time (`--parallel-directions`), same data, model and updates, in one run.

Each configuration is a full `align train` command (preparation included) run as a child
process; the configurations take turns for --repeats rounds and the fastest time of each
counts. The weights are compared too: parallel runs must equal the sequential run whose
threads per direction match (the tests check this exactly; here it is a sanity check on real
data).

    python eval/bench_parallel_directions.py -s data/sample/train.en -t data/sample/train.fr \
        --model hmm1 --max-updates 60 --output eval/results/parallel_directions.md
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

#: label -> extra `align train` options; the first is the reference (ratio 1)
CONFIGURATIONS: List[Tuple[str, List[str]]] = [
    ("sequential, 2 threads", ["--threads", "2", "--serial-directions"]),
    ("sequential, 1 thread", ["--threads", "1", "--serial-directions"]),
    ("parallel, 2 threads (1 per direction)", ["--threads", "2", "--parallel-directions"]),
]
#: which sequential run each parallel run must equal (same threads per direction)
SAME_WEIGHTS_AS = {"parallel, 2 threads (1 per direction)": "sequential, 1 thread"}


def same_weights(dir_a: str, dir_b: str) -> bool:
    import torch

    from aligner.model_dir import load_checkpoint_file

    for direction in ("fwd", "rev"):
        a = load_checkpoint_file(os.path.join(dir_a, direction, "params.last.pt"))["state_dict"]
        b = load_checkpoint_file(os.path.join(dir_b, direction, "params.last.pt"))["state_dict"]
        if a.keys() != b.keys() or not all(torch.equal(a[k], b[k]) for k in a):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-s", "--source", required=True)
    parser.add_argument("-t", "--target", required=True)
    parser.add_argument("--model", default="hmm1")
    parser.add_argument("--max-updates", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--train-args", default="--bpe-merges 1000 --d-model 64 --heads 4 "
                        "--encoder-layers 2 --decoder-layers 2 --ff-dim 256 --dropout 0 "
                        "--max-tokens 800 --lr 5e-3 --warmup 100",
                        help="further `align train` options (default: the demo's model)")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--output", default=None, help="Markdown file (default: stdout)")
    args = parser.parse_args()

    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-parallel-")
    base = ["align", "train", "-s", args.source, "-t", args.target, "--model", args.model,
            "--max-updates", str(args.max_updates), "--max-epochs", "0",
            "--checkpoint-interval", str(args.max_updates), "--device", "cpu", "-q",
            "--rounds", "1",
            "--overwrite", *shlex.split(args.train_args)]
    seconds: Dict[str, List[float]] = {label: [] for label, _ in CONFIGURATIONS}
    dirs = {}
    load_start = os.getloadavg()
    for _ in range(args.repeats):
        for k, (label, extra) in enumerate(CONFIGURATIONS):
            dirs[label] = os.path.join(workdir, f"run{k}")
            start = time.time()
            subprocess.run(base + ["-o", dirs[label]] + extra, check=True)
            seconds[label].append(time.time() - start)
    load_end = os.getloadavg()
    reference = min(seconds[CONFIGURATIONS[0][0]])
    lines = ["# Training both directions: one after the other vs `--parallel-directions`", "",
             f"Command: `python eval/bench_parallel_directions.py {' '.join(sys.argv[1:])}`  ",
             f"`align train` options: `{' '.join(base[2:])}`  ",
             f"Machine: {os.cpu_count()} CPU cores ({platform.machine()}), Python "
             f"{platform.python_version()}; load average {load_start[0]:.1f} at the start, "
             f"{load_end[0]:.1f} at the end. Wall time of the whole command (preparation, "
             f"training of both directions, checkpoints), fastest of {args.repeats}.", "",
             "| configuration | wall s | speed vs first row | weights |", "|---|---:|---:|---|"]
    for label, _ in CONFIGURATIONS:
        best = min(seconds[label])
        check = ""
        if label in SAME_WEIGHTS_AS:
            equal = same_weights(dirs[label], dirs[SAME_WEIGHTS_AS[label]])
            check = (f"{'identical to' if equal else 'DIFFERENT from'} "
                     f"'{SAME_WEIGHTS_AS[label]}'")
        lines.append(f"| {label} | {best:.1f} | {reference / best:.2f} | {check} |")
    text = "\n".join(lines) + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
