"""Benchmark: peak memory of one hmm0/hmm1 beam-search step, whole lexicon or chunked.

One decoding step of the direct HMM computes log p_lex(v|j) for N beam rows × (J+1) source
positions × V words. Before (``whole``, the decoder of commit 7b8823e, reproduced below by
:func:`whole_lexicon_model`) the step held that tensor whole, several times over (logits,
log_softmax, + log prior, logsumexp), and hmm1 kept the log_softmax until the forward update
of the chosen words. Now (aligner/models/direct_hmm.py :func:`mixture_log_probs`) the logits
exist for a chunk of source positions at a time (``lexicon_floats`` // (N·V) positions, at
least 1) and hmm1's forward update recomputes only the chosen words' (N', J+1) entries.

Everything goes through the models' decode contract (aligner/models/base.py:
``init_decode_state``, ``decode_step``, ``reorder_decode_state``): ``1-position`` is the
option ``lexicon_floats=1``, ``whole`` a subclass of the model's kind that overrides
``decode_step`` / ``reorder_decode_state``.

Each cell runs in a fresh subprocess (``--one``): build a random model (memory does not depend
on the weights), encode the sources, then measure two steps of the search: ``decode_step`` at
position 0, ``reorder_decode_state`` to the beam's rows and ``decode_step`` at position 1
(hmm1's forward update for the words chosen at 0 happens there; eval/results/
translate_memory.md was recorded before the decode contract, as one step + the update),
measured by eval/memory_probe.py (CPU: growth of the peak resident set with glibc's mmap
threshold fixed; CUDA: torch.cuda.max_memory_allocated). Writes a markdown table.

    python eval/bench_translate_memory.py --output eval/results/translate_memory.md

``--compare MODEL_DIR INPUT`` instead translates the first ``--lines`` lines of INPUT with a
trained hmm0/hmm1 model directory both ways and prints one markdown row: times, identical
outputs, largest log-probability difference.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_probe import FRESH_ENVIRONMENT, MiB, peak_of, run_fresh  # noqa: E402
SETTINGS = ("whole", "default", "1-position")


READING = """## Reading

* **whole**: the step holds about four (N, J+1, V) float32 tensors at once (logits,
  log_softmax, log prior + log p_lex, logsumexp's shifted exponentials), so its peak grows
  linearly with the source length J and would reach gigabytes at N·(J+1)·V of a few 10^8.
* **default**: only (N, c, V) logits of c source positions exist at a time (plus logsumexp's
  temporary of the same size): the peak is bounded by about 2-3 × LEXICON_CHUNK_FLOATS × 4 B
  (16 MiB per tensor) whatever J is; as many positions per chunk as fit, so short sources run
  in one chunk. Time per step is within ~10 % of whole (one matmul per chunk).
* **1-position**: the floor, N·V floats per tensor, at about 2× the time (J+1 small matmuls).
* **hmm1**: after the lexicon is chunked the peak is set by the first-order alignment model,
  which recomputes α(j | i, j') from W_o·relu(W_a·h_j + W_b·h_j' + D) for every beam row at
  every step: tensors of N·(J+2)·(J+1)·d floats (see its column), beyond the reach of
  LEXICON_CHUNK_FLOATS. That tensor depends on the source only: computing it once per sentence
  (not per beam row) and per sentence pair rather than per step would remove it (not done).
"""


def whole_lexicon_model(model):
    """`model` (hmm0/hmm1, same weights) decoding as before chunking (commit 7b8823e): each
    step holds the whole (N, J+1, V) lexicon, several times over, and hmm1 keeps its
    log_softmax for the forward update of the chosen words (gathered from the unselected rows,
    as before). A subclass of the model's kind overriding the decode contract's methods."""
    import torch

    from aligner.models.base import select_rows
    from aligner.models.direct_hmm import lexicon_logits
    from aligner.models.transformer import next_decode_state

    class WholeLexicon(type(model)):
        def decode_step(self, state, prev_tokens):
            # popped from the given state, so that the whole tensors die with this update
            pending = state.pop("pending_whole", None)
            state = next_decode_state(state)
            if pending is not None:                    # hmm1: q of the words chosen before
                rows, log_prior, log_lex, log_p = pending
                state["forward"] = (log_prior[rows] + log_lex[rows, :, prev_tokens]
                                    - log_p[rows, prev_tokens][:, None])
                del pending, log_prior, log_lex, log_p
            log_alpha, source_hidden, target_hidden = self.decode_position(state, prev_tokens)
            log_prior = self.decode_prior(log_alpha, state, prev_tokens)
            _, logits = lexicon_logits(source_hidden, target_hidden[:, None, :],
                                       self.lexicon.weight, self.lexicon.bias)
            log_lex = torch.log_softmax(logits.float(), dim=-1)              # (N, J+1, V)
            log_p = torch.logsumexp(log_prior[:, :, None] + log_lex, dim=1)
            if self.order == 1:
                state["pending_whole"] = (None, log_prior, log_lex, log_p)
            return log_p, state

        def reorder_decode_state(self, state, rows):
            kept = select_rows({k: v for k, v in state.items() if k != "pending_whole"}, rows)
            if state.get("pending_whole") is not None:   # not copied: rows are read later
                kept["pending_whole"] = (rows,) + tuple(state["pending_whole"][1:])
            return kept

    whole = WholeLexicon(model.config)
    whole.load_state_dict(model.state_dict())
    return whole.to(next(model.parameters()).device).eval()


def one(kind: str, rows: int, length: int, vocab: int, d_model: int, setting: str,
        device_name: str) -> dict:
    """Two decoding steps in this process: peak extra memory (MiB), time (s), a checksum."""
    import torch

    from aligner import constants as C
    from aligner.models import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    device = torch.device(device_name)
    config = dict(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d_model, n_heads=4,
                  enc_layers=1, dec_layers=1, d_ff=2 * d_model, dropout=0.0,
                  max_positions=max(256, length + 2))
    model = build_model(kind, config).to(device).eval()
    src = torch.randint(4, vocab, (rows, length + 1), device=device)
    src[:, -1] = C.EOS_ID
    options = {"lexicon_floats": 1} if setting == "1-position" else {}
    if setting == "whole":               # after drawing src: building it draws random weights
        model = whole_lexicon_model(model)
    tokens = torch.full((rows,), C.BOS_ID, device=device)

    def two_steps(state, n_rows):
        log_p, state = model.decode_step(state, tokens[:n_rows])
        words = log_p.argmax(-1)
        state = model.reorder_decode_state(state, torch.arange(n_rows, device=device))
        return model.decode_step(state, words)

    with torch.no_grad():
        two_steps(model.init_decode_state(src[:1, -2:], **options), 1)   # allocates buffers
        state = model.init_decode_state(src, **options)
        measured = peak_of(lambda: two_steps(state, rows), device)
    log_p, state = measured["value"]
    checksum = float(log_p.max(-1).values.sum())
    if kind == "hmm1":
        checksum += float(state["forward"].exp().sum())
    return {"peak_mib": measured["peak_mib"], "seconds": measured["seconds"],
            "checksum": checksum}


def compare(model_dir: str, input_path: str, n_lines: int, beam: int) -> str:
    """Translate the first `n_lines` of `input_path` with a trained hmm0/hmm1 model directory,
    whole lexicon vs chunked (default), 1 thread: a markdown row (times, identical outputs)."""
    import torch

    from aligner.model_dir import LoadedModelDir
    from aligner.translate import encode_inputs, translate_inputs

    torch.set_num_threads(1)
    with open(input_path, encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for _, line in zip(range(n_lines), handle)]
    loaded = LoadedModelDir.load(model_dir, ("fwd",))
    model = loaded.models["fwd"]
    models = {"chunked": model, "whole": whole_lexicon_model(model)}
    results, seconds = {}, {}
    for setting in ("chunked", "whole", "chunked"):     # chunked twice: warm-up, noise
        start = time.perf_counter()
        results[setting] = translate_inputs(models[setting],
                                            encode_inputs(loaded, lines, "fwd"),
                                            loaded.tgt_vocab.tokens, beam=beam)
        seconds[setting] = min(seconds.get(setting, 1e9), time.perf_counter() - start)
    pairs = list(zip(results["chunked"], results["whole"]))
    same = sum(a.subwords == b.subwords for a, b in pairs)
    delta = max((abs(a.log_prob - b.log_prob) for a, b in pairs if a.subwords == b.subwords),
                default=0.0)
    return (f"| {model_dir} ({loaded.config.model_kind}) | {len(lines)} | {beam} | "
            f"{seconds['whole']:.1f} | {seconds['chunked']:.1f} | {same}/{len(lines)} | "
            f"{delta:.1e} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=["hmm0", "hmm1"])
    parser.add_argument("--rows", type=int, default=40, help="beam rows N (beam × sentences)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64],
                        help="source subwords J (without EOS)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", default=None)
    parser.add_argument("--one", nargs=3, metavar=("KIND", "LENGTH", "SETTING"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--compare", nargs=2, metavar=("MODEL_DIR", "INPUT"),
                        help="instead: translate INPUT with a trained hmm model directory, "
                             "whole vs chunked lexicon; prints one markdown table row")
    parser.add_argument("--lines", type=int, default=50, help="--compare: first N lines")
    parser.add_argument("--beam", type=int, default=5, help="--compare: beam size")
    args = parser.parse_args()
    if args.compare:
        print(compare(args.compare[0], args.compare[1], args.lines, args.beam))
        return
    if args.one:
        kind, length, setting = args.one
        print(json.dumps(one(kind, args.rows, int(length), args.vocab, args.d_model, setting,
                             args.device)))
        return

    from aligner.models.direct_hmm import LEXICON_CHUNK_FLOATS
    from aligner.utils import atomic_output

    results = {}
    for kind in args.kinds:
        for length in args.lengths:
            for setting in SETTINGS:
                command = [sys.executable, __file__, "--rows", str(args.rows), "--vocab",
                           str(args.vocab), "--d-model", str(args.d_model), "--device",
                           args.device, "--one", kind, str(length), setting]
                results[kind, length, setting] = run_fresh(command)
                print(f"{kind} J={length} {setting}: {results[kind, length, setting]}",
                      file=sys.stderr)

    rows, vocab = args.rows, args.vocab
    default_positions = max(1, LEXICON_CHUNK_FLOATS // (rows * vocab))
    with atomic_output(args.output) as out:
        out.write("# Peak memory of one hmm0/hmm1 decoding step: whole lexicon or chunked\n\n")
        out.write(f"Command: `python eval/bench_translate_memory.py "
                  f"{' '.join(sys.argv[1:])}`  \n")
        out.write(f"Device: {args.device} ({platform.machine()}), float32, 1 thread; N = "
                  f"{rows} beam rows (e.g. beam 5 × 8 sentences), vocabulary V = {vocab}, "
                  f"d_model = lexicon dim k = {args.d_model}, 1 encoder + 1 decoder layer, "
                  "random weights. One fresh process per cell; memory = growth of the peak "
                  "resident set during two steps (decode_step at positions 0 and 1, the "
                  "second with hmm1's forward update of the words chosen at 0), glibc "
                  f"MALLOC_MMAP_THRESHOLD_={FRESH_ENVIRONMENT['MALLOC_MMAP_THRESHOLD_']} (CPU), "
                  "or max_memory_allocated (CUDA).\n\n")
        out.write(f"Settings: **whole** = the decoding step before chunking (the whole "
                  f"(N, J+1, V) lexicon); **default** = chunks of LEXICON_CHUNK_FLOATS = "
                  f"{LEXICON_CHUNK_FLOATS} floats, here {default_positions} source positions "
                  f"per chunk; **1-position** = lexicon_floats 1, one source position per chunk "
                  f"(the floor: N·V floats).\n\n")
        for kind in args.kinds:
            out.write(f"## {kind}\n\n")
            extra = (" first-order α hidden N·(J+2)·(J+1)·d·4 B, MiB |" if kind == "hmm1"
                     else "")
            out.write(f"| J | lexicon N·(J+1)·V·4 B, MiB |{extra} whole: MiB (s) | "
                      f"default: MiB (s) | 1-position: MiB (s) |\n"
                      f"|---|---|{'---|' if extra else ''}---|---|---|\n")
            for length in args.lengths:
                tensor = rows * (length + 1) * vocab * 4 / MiB
                alignment = rows * (length + 2) * (length + 1) * args.d_model * 4 / MiB
                cells = " | ".join(f"{results[kind, length, s]['peak_mib']:.0f} "
                                   f"({results[kind, length, s]['seconds']:.3f})"
                                   for s in SETTINGS)
                column = f" {alignment:.0f} |" if extra else ""
                out.write(f"| {length} | {tensor:.0f} |{column} {cells} |\n")
            same = all(abs(results[kind, length, s]["checksum"]
                           - results[kind, length, "whole"]["checksum"]) < 1e-3
                       for length in args.lengths for s in SETTINGS)
            out.write(f"\nSame log-probabilities{' and forward states' if kind == 'hmm1' else ''}"
                      f" in every setting (checksums agree to 1e-3): {same}\n\n")
        out.write(READING)


if __name__ == "__main__":
    main()
