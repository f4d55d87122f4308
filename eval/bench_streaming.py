"""Streaming `align extract`: latency of one pair once the model is loaded, and throughput of
the streaming path against the file (block) path on the same lines.

Latency: one `align extract MODEL -i - -o - -q` process (the model loaded once); after a
warm-up pair, each of --latency-pairs pairs is written alone and the time until its line
comes back is measured (median, 90th percentile, max), for each --stream-wait given.

Throughput: the same N lines (a `source ||| target` file) aligned by
  file mode:       align extract MODEL -i FILE -o OUT -q
  streaming mode:  cat FILE | align extract MODEL -i - -o - -q > OUT
each run --repeat times (best wall time kept); the model load (and start-up) time, measured as
the wall time of aligning one line, is subtracted to give pairs/s of the alignment itself.
Both outputs are compared (they must be equal line for line).

Usage:
  python eval/bench_streaming.py MODEL_DIR LINES.joint [--latency-pairs 30] [--repeat 2]
      [--stream-wait 0.05 --stream-wait 0] [--extra "-H soft-average"]
Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import os
import select
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Sequence

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
ALIGN = [sys.executable, "-m", "aligner"]


def latency(model: str, pairs: Sequence[str], wait: float, extra: List[str]) -> List[float]:
    """Seconds from writing each pair to reading its alignment (a warm-up pair first)."""
    process = subprocess.Popen([*ALIGN, "extract", model, "-i", "-", "-o", "-", "-q",
                                "--stream-wait", str(wait), *extra], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env=ENV)
    times = []
    try:
        for k, pair in enumerate([pairs[0], *pairs]):
            start = time.perf_counter()
            process.stdin.write((pair + "\n").encode())
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], 600)
            assert ready, "no answer"
            process.stdout.readline()
            if k > 0:   # the first answer includes loading the model
                times.append(time.perf_counter() - start)
        process.stdin.close()
        assert process.wait(timeout=600) == 0
    finally:
        process.kill()
    return times


def timed(command: str) -> float:
    start = time.perf_counter()
    subprocess.run(command, shell=True, check=True, env=ENV)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("lines", help="'source ||| target' file")
    parser.add_argument("--latency-pairs", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--stream-wait", type=float, action="append", default=None)
    parser.add_argument("--extra", default="", help="further align extract options")
    args = parser.parse_args()
    extra = shlex.split(args.extra)
    waits = args.stream_wait or [0.05, 0.0]
    lines = Path(args.lines).read_text(encoding="utf-8").splitlines()
    align = shlex.join(ALIGN)
    model, joint = shlex.quote(args.model), shlex.quote(args.lines)
    options = shlex.join(extra)

    print("| measure | value |\n|---|---|")
    for wait in waits:
        times = latency(args.model, lines[:args.latency_pairs], wait, extra)
        ordered = sorted(times)
        p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
        print(f"| latency of one pair, --stream-wait {wait:g} ({len(times)} pairs) | median "
              f"{1000 * statistics.median(times):.0f} ms, p90 {1000 * p90:.0f} ms, max "
              f"{1000 * max(times):.0f} ms |", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        one = os.path.join(tmp, "one.joint")
        Path(one).write_text(lines[0] + "\n", encoding="utf-8")
        load = min(timed(f"{align} extract {model} -i {one} -o {tmp}/one.out -q {options}")
                   for _ in range(args.repeat))
        file_time = min(timed(f"{align} extract {model} -i {joint} -o {tmp}/file.out -q "
                              f"{options}") for _ in range(args.repeat))
        runs = [("file mode", file_time)]
        same = True
        for wait in waits:
            runs.append((f"streaming mode, --stream-wait {wait:g}", min(
                timed(f"cat {joint} | {align} extract {model} -i - -o - -q --stream-wait "
                      f"{wait} {options} > {tmp}/stream.out") for _ in range(args.repeat))))
            same = same and (Path(f"{tmp}/file.out").read_bytes()
                             == Path(f"{tmp}/stream.out").read_bytes())
    n = len(lines)
    print(f"| start-up + model load (one line, file mode) | {load:.2f} s |")
    for name, seconds in runs:
        rate = n / max(seconds - load, 1e-9)
        print(f"| {name}, {n} lines | {seconds:.2f} s wall, {rate:.0f} pairs/s after the "
              f"load |")
    print(f"| outputs identical (file and every streaming run) | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
