"""Time one attention call, forward and backward, on the CPU: torch's
``F.scaled_dot_product_attention`` in float32 and in bfloat16, and the explicit products that
``MultiHeadAttention`` takes when training in bfloat16 on a CPU (aligner/models/transformer.py).

    python eval/bench_attention_cpu.py --shape 40 4 30 32 --threads 1 --repeats 30

Prints milliseconds per call (mean over `--repeats` after 5 warm-up calls); the sentences of
batch item 0 have their last 5 keys padded.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F


def explicit(q, k, v, allowed):
    """The explicit path: scores, float32 softmax rounded to q's dtype, weights × values."""
    scores = (q @ k.transpose(-2, -1)) / q.size(-1) ** 0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v


def time_call(dtype, attention, shape, repeats):
    batch, heads, length, dim = shape
    q, k, v = (torch.randn(batch, heads, length, dim, dtype=dtype, requires_grad=True)
               for _ in range(3))
    allowed = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    allowed[0, ..., -5:] = False
    grad = torch.randn(batch, heads, length, dim, dtype=dtype)
    for call in range(repeats + 5):
        if call == 5:
            start = time.perf_counter()
        attention(q, k, v, allowed).backward(grad)
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=int, nargs=4, default=[40, 4, 30, 32],
                        metavar=("B", "H", "L", "D"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sdpa = lambda q, k, v, allowed: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    for name, dtype, attention in [("float32 SDPA", torch.float32, sdpa),
                                   ("bfloat16 SDPA", torch.bfloat16, sdpa),
                                   ("bfloat16 explicit products", torch.bfloat16, explicit)]:
        print(f"{name}: {time_call(dtype, attention, args.shape, args.repeats):.2f} ms")


if __name__ == "__main__":
    main()
