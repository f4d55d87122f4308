"""Benchmark: peak memory of the hmm0 training step with and without the chunked lexicon.

The lexicon tensor is B × I × J × V. Without chunking (``lexicon_chunk`` 0) the whole tensor
(and its gradient) exists at once; with chunk c only B × c × J × V logits of one chunk live at
a time, in the forward and, by recomputation, in the backward pass.

Each setting runs in a fresh subprocess (``--one``): build the model and the batch, then one
loss + backward, measured by eval/memory_probe.py (CPU: growth of the peak resident set with
glibc's mmap threshold fixed; CUDA: torch.cuda.max_memory_allocated). Writes a markdown table
(stdout or --output).

    python eval/bench_hmm_memory.py --output eval/results/hmm_memory.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_probe import FRESH_ENVIRONMENT, MiB, peak_of, run_fresh  # noqa: E402


def one(kind: str, batch: int, length: int, vocab: int, d_model: int, chunk: int,
        device_name: str, chunk_floats: int = -1) -> dict:
    """One training step in this process; returns peak extra memory (MiB) and time (s)."""
    import torch

    from aligner.models import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    device = torch.device(device_name)
    config = dict(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d_model, n_heads=4,
                  enc_layers=1, dec_layers=1, d_ff=2 * d_model, dropout=0.0,
                  lexicon_chunk=chunk)
    if chunk_floats >= 0:   # hmm1: the budget of the (B, I+1, J+2, J+1) transition chunks
        config["chunk_floats"] = chunk_floats
    model = build_model(kind, config).to(device)
    src = torch.randint(4, vocab, (batch, length + 1), device=device)
    src[:, -1] = 2
    tgt_in = torch.randint(4, vocab, (batch, length + 1), device=device)
    tgt_in[:, 0] = 1
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full((batch, 1), 2, device=device)], dim=1)

    def step():
        loss, n_tokens = model.loss(src, tgt_in, tgt_out, label_smoothing=0.1)
        (loss / n_tokens).backward()
        return loss.item() / n_tokens.item()

    measured = peak_of(step, device)
    return {"peak_mib": measured["peak_mib"], "seconds": measured["seconds"],
            "loss": measured["value"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="hmm0", choices=["hmm0", "hmm1"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64],
                        help="I = J values (subwords per sentence, without EOS)")
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 8, 2],
                        help="lexicon_chunk values (0 = no chunking)")
    parser.add_argument("--chunk-floats", type=int, nargs="+", default=None,
                        help="hmm1: chunk_floats values (0 = the whole transition tensor); "
                             "replaces --chunks as the columns (lexicon_chunk stays 8)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", default=None)
    parser.add_argument("--one", nargs=3, type=int, metavar=("LENGTH", "CHUNK", "FLOATS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.kind, args.batch, args.one[0], args.vocab, args.d_model,
                             args.one[1], args.device, args.one[2])))
        return
    # columns: lexicon chunks, or (hmm1) transition budgets at lexicon chunk 8
    columns = ([(8, f) for f in args.chunk_floats] if args.chunk_floats
               else [(c, -1) for c in args.chunks])

    from aligner.utils import atomic_output

    results = {}
    for length in args.lengths:
        for column in columns:
            command = [sys.executable, __file__, "--kind", args.kind, "--batch", str(args.batch),
                       "--vocab", str(args.vocab), "--d-model", str(args.d_model),
                       "--device", args.device, "--one", str(length), str(column[0]),
                       str(column[1])]
            results[length, column] = run_fresh(command)
            print(f"I=J={length} {column}: {results[length, column]}", file=sys.stderr)

    with atomic_output(args.output) as out:
        out.write(f"# {args.kind}: peak memory of one training step, chunked lexicon or not\n\n")
        out.write(f"Command: `python eval/bench_hmm_memory.py {' '.join(sys.argv[1:])}`  \n")
        out.write(f"Device: {args.device} ({platform.machine()}); batch {args.batch}, vocabulary "
                  f"{args.vocab}, d_model {args.d_model}, 1 encoder + 1 decoder layer, float32, "
                  "label smoothing 0.1. One fresh process per cell; memory = growth of the peak "
                  "resident set during loss + backward (CPU, glibc "
                  f"MALLOC_MMAP_THRESHOLD_={FRESH_ENVIRONMENT['MALLOC_MMAP_THRESHOLD_']}) or "
                  "max_memory_allocated (CUDA).  \n")
        out.write("The whole lexicon logits tensor B·(I+1)·(J+1)·V·4 bytes is given for "
                  "reference. Chunk = target positions per lexicon chunk (0 = no chunking); "
                  "floats = hmm1's chunk_floats, the budget of the B·(I+1)·(J+2)·(J+1) "
                  "transition scores (0 = the whole tensor at once).\n\n")
        header = " | ".join((f"floats {f or 'whole'}" if f >= 0 else f"chunk {c or 'none'}")
                            + ": MiB (s)" for c, f in columns)
        out.write(f"| I = J | logits tensor MiB | {header} |\n")
        out.write("|---" * (2 + len(columns)) + "|\n")
        for length in args.lengths:
            logits = args.batch * (length + 1) ** 2 * args.vocab * 4 / MiB
            cells = " | ".join(f"{results[length, c]['peak_mib']:.0f} "
                               f"({results[length, c]['seconds']:.2f})" for c in columns)
            out.write(f"| {length} | {logits:.0f} | {cells} |\n")
        losses = {round(r["loss"], 4) for r in results.values()}
        out.write(f"\nLoss per token is the same in every column of a row "
                  f"(chunking is exact): {sorted(losses)}\n")


if __name__ == "__main__":
    main()
