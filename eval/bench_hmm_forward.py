"""Benchmark: first-order HMM forward (log Z) as a loop over I vs. a log-semiring tree reduction.

Both compute the same log Z (aligner/models/hmm_algorithms.py: forward_log_z and
forward_log_z_parallel); this script times them, forward only and forward + backward (the
backward is what training and the autograd posteriors pay), on random normalized HMMs of
realistic size, and checks that they agree. Writes a markdown table (stdout, or --output).

    python eval/bench_hmm_forward.py --output eval/results/hmm_forward.md
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from typing import Callable, List

import torch

from aligner.models import hmm_algorithms as hmm
from aligner.utils import atomic_output


def random_hmm(batch: int, steps: int, states: int, device: torch.device):
    """Peaked random log-probabilities (like a trained model's): emission, initial, transition."""
    generator = torch.Generator().manual_seed(0)
    emission = torch.log_softmax(torch.randn(batch, steps, states, generator=generator) * 3, -1)
    initial = torch.log_softmax(torch.randn(batch, states, generator=generator) * 3, -1)
    transition = torch.log_softmax(
        torch.randn(batch, steps, states, states, generator=generator) * 3, -1)
    return emission.to(device), initial.to(device), transition.to(device)


def time_it(function: Callable[[], None], repeats: int, device: torch.device) -> float:
    """Median wall time in milliseconds of `repeats` calls after one warm-up call."""
    function()
    times: List[float] = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        function()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sizes", type=int, nargs="+", default=[30, 40, 60],
                        help="I = J values to time")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", default=None, help="markdown file (default stdout)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    rows = []
    for size in args.sizes:
        emission, initial, transition = random_hmm(args.batch, size, size, device)
        functions = {"loop": hmm.forward_log_z, "tree": hmm.forward_log_z_parallel}
        values = {name: f(emission, initial, transition) for name, f in functions.items()}
        difference = (values["loop"] - values["tree"]).abs().max().item()
        timings = {}
        for name, function in functions.items():
            def forward(function=function):
                with torch.no_grad():
                    function(emission, initial, transition)

            def forward_backward(function=function):
                leaf = emission.clone().requires_grad_(True)
                hmm.posteriors(function(leaf, initial, transition), leaf)

            timings[name] = (time_it(forward, args.repeats, device),
                             time_it(forward_backward, args.repeats, device))
        rows.append((size, timings, difference))
        print(f"I=J={size}: loop {timings['loop']} ms, tree {timings['tree']} ms, "
              f"max |Δ log Z| {difference:.2e}", file=sys.stderr)

    with atomic_output(args.output) as out:
        out.write("# First-order HMM forward: loop over I vs. log-semiring tree reduction\n\n")
        out.write(f"Command: `python eval/bench_hmm_forward.py {' '.join(sys.argv[1:])}`  \n")
        out.write(f"Device: {device.type} ({platform.processor() or platform.machine()}), "
                  f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s), "
                  f"batch {args.batch}, float32, median of {args.repeats} runs.  \n")
        out.write("fwd = log Z only (no_grad); fwd+bwd = log Z and posteriors by autograd.\n\n")
        out.write("| I = J | loop fwd ms | tree fwd ms | loop fwd+bwd ms | tree fwd+bwd ms "
                  "| faster (fwd+bwd) | max abs. diff. log Z |\n")
        out.write("|---|---|---|---|---|---|---|\n")
        for size, timings, difference in rows:
            loop, tree = timings["loop"], timings["tree"]
            faster = "loop" if loop[1] < tree[1] else "tree"
            ratio = max(loop[1], tree[1]) / min(loop[1], tree[1])
            out.write(f"| {size} | {loop[0]:.1f} | {tree[0]:.1f} | {loop[1]:.1f} | "
                      f"{tree[1]:.1f} | {faster} ({ratio:.1f}x) | {difference:.1e} |\n")


if __name__ == "__main__":
    main()
