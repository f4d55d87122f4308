"""Where the final alignment's time goes, and how far it is from the arithmetic bound.

Profiles `align extract`'s default path (``hmm-posterior``, both directions, ``-H
soft-average``) of a direct-HMM model directory (hmm0 / hmm1) on the first --pairs lines of a
bitext, stage by stage, in this one process with --threads threads:

* ``read``            reading and splitting the lines (aligner.formats.read_bitext)
* ``bpe``             tokenization, BPE and vocabulary ids (aligner.inference.encode_bitext)
* ``batches``         length-sorted batches and their tensors (aligner.inference.pair_batches)
* ``encoder``         the source encoder, h = Encoder(src)
* ``decoder``         target embedding and the decoder layers before the output layer
* ``output``          the output layer: self-attention, W5·h, W6·s, hmm1's alignment keys
                      and queries (log α itself is computed inside the forward–backward)
* ``lexicon``         log p_lex(e_i | j): the normalization over the target vocabulary for
                      every (target position, source position)
* ``transitions``     hmm1's log α(j | i, j') tensors, asked for by the forward–backward
* ``forward-backward`` the posteriors γ given emissions and transitions (minus ``transitions``)
* ``word-matrices``   subword posteriors to word-level soft matrices (inference.word_matrix)
* ``teacher``         the recipe's teacher mixed into the output, where the model directory has
                      one (aligner/extract/mixture.py; --no-teacher: left out): its reading
                      of the lines, its posteriors of both directions and the mix (the
                      symmetrization below then takes the one threshold, not the mixture's
                      per-line ones)
* ``symmetrize``      soft-average of the two directions and its links (aligner.combine)
* ``write``           formatting the Pharaoh lines and writing them

Each model stage runs the very calls of DirectHMM.alignment_scores in order; the script checks
that the staged γ equals alignment_scores' on the first batch of each direction. Matrix-product
arithmetic per stage is counted by torch.utils.flop_counter.FlopCounterMode (mm, bmm, addmm,
matmul, scaled dot product: the work a GEMM does; element-wise work is not counted). A GEMM
benchmark in the same run (torch.mm of the shapes below, same threads) gives this machine's
matrix-product rate; the lower bound of a stage is its flops at that rate.

    python eval/profile_extract.py --model-dir MODEL -s big.en -t big.fr --pairs 20000 \
        --threads 2 -o eval/results/profile_extract.md
"""
from __future__ import annotations

import contextlib
import datetime
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

import click
import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aligner import constants as C  # noqa: E402
from aligner.links.combine import combine  # noqa: E402
from aligner.formats import format_links, read_bitext  # noqa: E402
from aligner.extract import inference  # noqa: E402
from aligner.extract.mixture import mix, resolve_mixture  # noqa: E402
from aligner.malloc import (RELEASE_BATCHES, keep_freed_memory, limit_kernel_cache,  # noqa: E402
                            release_free_memory)
from aligner.model_dir import LoadedModelDir  # noqa: E402
from aligner.models import hmm_algorithms  # noqa: E402
from aligner.training import recipe  # noqa: E402

STAGES = ("read", "bpe", "batches", "encoder", "decoder", "output", "lexicon", "transitions",
          "forward-backward", "word-matrices", "teacher", "symmetrize", "write")


class Clock:
    """Seconds and matrix-product flops per stage; ``count`` turns flop counting on."""

    def __init__(self, count: bool) -> None:
        self.seconds: Dict[str, float] = defaultdict(float)
        self.flops: Dict[str, int] = defaultdict(int)
        self.count = count

    @contextlib.contextmanager
    def stage(self, name: str):
        counter = FlopCounterMode(display=False) if self.count else contextlib.nullcontext()
        start = time.perf_counter()
        with counter:
            yield
        self.seconds[name] += time.perf_counter() - start
        if self.count:
            self.flops[name] += counter.get_total_flops()


def staged_posteriors(model, batch, clock: Clock, options) -> torch.Tensor:
    """γ (B, I+1, J+1) of one batch by the calls of DirectHMM.alignment_scores, timed."""
    src, tgt_in, tgt_out = batch.src, batch.tgt_in, batch.tgt_out
    with clock.stage("encoder"):
        memory = model.encode(src)
    tgt_pad_mask, src_pad_mask = tgt_in.eq(C.PAD_ID), src.eq(C.PAD_ID)
    with clock.stage("decoder"):
        x = model.embed(tgt_in)
        for layer in model.layers:
            x = layer(x, memory, tgt_pad_mask, src_pad_mask, None)
    with clock.stage("output"):
        log_alpha, source_hidden, target_hidden = model.output_layer(
            x, memory, tgt_pad_mask, src_pad_mask, None, None, lazy=model.order == 1)
    with clock.stage("lexicon"):
        log_emission, log_link = model.emissions(source_hidden, target_hidden, tgt_out,
                                                 shortlist=options.get("shortlist", 0))
    if model.order == 0:
        with clock.stage("forward-backward"):
            return hmm_algorithms.zero_order_posterior(log_alpha, log_emission,
                                                       src.ne(C.PAD_ID), log_link)
    # the transitions are computed inside the forward-backward, on demand: their calls are a
    # stage of their own, taken out of the forward-backward's time and flops
    def timed(function):
        def call(*args, **kwargs):
            with clock.stage("transitions"):
                return function(*args, **kwargs)
        return call

    log_alpha.transitions = timed(log_alpha.transitions)
    log_alpha.transition_probs = timed(log_alpha.transition_probs)
    seconds, flops = clock.seconds["transitions"], clock.flops["transitions"]
    with clock.stage("forward-backward"):
        gamma = model._posterior(log_alpha, log_emission, log_link, src, tgt_out)
    clock.seconds["forward-backward"] -= clock.seconds["transitions"] - seconds
    clock.flops["forward-backward"] -= clock.flops["transitions"] - flops
    return gamma


@torch.no_grad()
def profile(loaded, bitext, clock: Clock, max_tokens, options, threshold: float, out,
            mixture=None):
    """The extraction of `bitext` with `loaded` (and its `mixture`, if any), stage by stage;
    returns (pairs, links)."""
    with clock.stage("bpe"):
        pairs = inference.encode_bitext(loaded, bitext)
    soft = {}
    checked = set()
    for direction in C.DIRECTIONS:
        model = loaded.models[direction]
        model.eval()
        renormalize = not model.leaves_unaligned_mass("hmm-posterior")
        matrices = [inference.no_alignment(p) for p in pairs]
        batches = inference.pair_batches(model, pairs, direction, max_tokens,
                                         torch.device("cpu"))
        batches_done = 0
        while True:
            with clock.stage("batches"):
                item = next(batches, None)
            if item is None:
                break
            indices, batch = item
            gamma = staged_posteriors(model, batch, clock, options)
            batches_done += 1
            if batches_done % RELEASE_BATCHES == 0:   # as align extract does (inference.py)
                release_free_memory()
            if direction not in checked:
                reference = model.alignment_scores(batch.src, batch.tgt_in, batch.tgt_out,
                                                   "hmm-posterior", **options)
                assert torch.equal(gamma, reference), "staged γ differs from alignment_scores"
                checked.add(direction)
            with clock.stage("word-matrices"):
                scores = gamma.float().numpy()
                for row, k in enumerate(indices):
                    matrices[k] = inference.word_matrix(scores[row], pairs[k], direction,
                                                        renormalize, recipe.SUBWORD_POOLING)
        soft[direction] = matrices
    if mixture is not None:
        with clock.stage("teacher"):
            other = mixture.soft(mixture.encode(bitext), max_tokens, torch.device("cpu"),
                                 pooling=recipe.SUBWORD_POOLING)
            soft = mix(soft, other, mixture.weight, mixture.long_line)
    with clock.stage("symmetrize"):
        links = combine("soft-average", threshold, hard={}, soft=soft)
    with clock.stage("write"):
        out.writelines(format_links(line) + "\n" for line in links)
    return pairs, links


def gemm_rate(threads: int, shapes, dtype=torch.float32, seconds: float = 1.0) -> List[float]:
    """GFLOP/s of torch.mm (M×K)·(K×N) for each (M, K, N) in `shapes`, best of repeats."""
    torch.set_num_threads(threads)
    rates = []
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        for _ in range(3):
            torch.mm(a, b)
        best, spent = float("inf"), 0.0
        while spent < seconds:
            start = time.perf_counter()
            torch.mm(a, b)
            took = time.perf_counter() - start
            best, spent = min(best, took), spent + took
        rates.append(2 * m * k * n / best / 1e9)
    return rates


@click.command()
@click.option("--model-dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("-s", "--source", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-t", "--target", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--pairs", default=20000, show_default=True, help="First lines profiled.")
@click.option("--threads", default=2, show_default=True)
@click.option("--max-tokens", default=None, type=int,
              help="Positions per batch [default: align extract's on the CPU].")
@click.option("--shortlist", default=0, show_default=True)
@click.option("--threshold", default=None, type=float,
              help="soft-average threshold [default: the model directory's].")
@click.option("--precision", type=click.Choice(["fp32", "bf16"]), default="fp32",
              show_default=True, help="bf16: the model under bfloat16 autocast (as align "
              "extract --precision bf16).")
@click.option("-o", "--output", default="-", type=click.File("w"), help="Markdown report.")
@click.option("--links", default=None, type=click.Path(dir_okay=False),
              help="Also keep the links written (default: discarded).")
@click.option("--teacher/--no-teacher", default=True, show_default=True,
              help="Mix the model directory's teacher into the output, as align extract "
              "does by default (where it has one).")
def main(model_dir, source, target, pairs, threads, max_tokens, shortlist, threshold,
         precision, output, links, teacher):
    """Profile the final alignment of MODEL stage by stage and write the table."""
    # the process settings of the align command (aligner/cli/__init__.py): freed memory kept
    # for the next batch's tensors, a bounded oneDNN kernel cache
    keep_freed_memory()
    limit_kernel_cache()
    torch.set_num_threads(threads)
    options = {"shortlist": shortlist} if shortlist else {}
    loaded = LoadedModelDir.load(model_dir, C.DIRECTIONS, "best", torch.device("cpu"))
    if threshold is None:
        _, threshold = loaded.symmetrization("soft-average")
    mixture = (resolve_mixture(loaded, None, None, "both", "soft-average", torch.device("cpu"))
               if teacher else None)
    loading = time.perf_counter()
    if mixture is not None:   # loaded once per process: not a cost per pair, not timed below
        for direction in C.DIRECTIONS:   # each lexicon's hash index built
            mixture.loaded.models[direction].lexicon()
    loading = time.perf_counter() - loading
    clock = Clock(count=False)
    with clock.stage("read"):
        bitext = read_bitext(source, target)
        bitext.source, bitext.target = bitext.source[:pairs], bitext.target[:pairs]
    sink = open(links, "w", encoding="utf-8") if links else open("/dev/null", "w")
    def autocast():
        return (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())
    start = time.perf_counter()
    with sink, autocast():
        encoded, _ = profile(loaded, bitext, clock, max_tokens, options, threshold, sink,
                             mixture)
    wall = time.perf_counter() - start + clock.seconds["read"]
    # flops: a second pass with the counter on, over a 1,000-line share, scaled
    share = min(len(bitext), 1000)
    counted = Clock(count=True)
    bitext.source, bitext.target = bitext.source[:share], bitext.target[:share]
    with open("/dev/null", "w") as sink, autocast():
        profile(loaded, bitext, counted, max_tokens, options, threshold, sink, mixture)
    scale = len(encoded) / share
    shapes = [(1024, 1024, 1024), (500, 64, 5000), (500, 128, 128), (512, 128, 512)]
    # the bound at the products' rate in the precision the model runs in (bfloat16 products
    # are about 4x float32's on a CPU with avx512_bf16/AMX); float32's rate reported beside it
    rates = gemm_rate(threads, shapes)
    rates_run = gemm_rate(threads, shapes, torch.bfloat16) if precision == "bf16" else rates
    peak = max(rates_run)
    src_subwords = sum(len(p.src_ids) for p in encoded) / len(encoded)
    tgt_subwords = sum(len(p.tgt_ids) for p in encoded) / len(encoded)
    config = loaded.models["fwd"].config
    teacher_note = (f"teacher mixed in at {mixture.weight} (loaded in {loading:.1f} s, not "
                    f"counted)" if mixture else "no teacher")
    w = output.write
    w(f"# Profile of the final alignment: {len(encoded):,} pairs, {threads} thread(s)\n\n")
    w(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
      f"{platform.processor() or platform.machine()}, torch {torch.__version__}; model "
      f"`{model_dir}` ({type(loaded.models['fwd']).__name__}, d_model {config.d_model}, "
      f"{config.enc_layers}+{config.dec_layers} layers, lexicon {config.lexicon_dim}, "
      f"vocabularies {loaded.models['fwd'].config.src_vocab_size:,} / "
      f"{loaded.models['fwd'].config.tgt_vocab_size:,}); {src_subwords:.1f} source and "
      f"{tgt_subwords:.1f} target subwords per pair; threshold {threshold}; "
      f"shortlist {shortlist or 'none (exact)'}; {precision}; "
      f"{teacher_note}; batches of "
      f"{max_tokens or inference.CPU_MAX_TOKENS} positions.\n\n")
    w(f"Wall time {wall:.1f} s: **{len(encoded) / wall:.0f} pairs/s** (both directions in this "
      f"one process, {threads} thread(s)).\n\n")
    w("GEMM rate (torch.mm, float32, same threads): "
      + ", ".join(f"{m}×{k}·{k}×{n} {r:.0f}" for (m, k, n), r in zip(shapes, rates))
      + " GFLOP/s")
    if precision == "bf16":
        w("; bfloat16: " + ", ".join(f"{m}×{k}·{k}×{n} {r:.0f}"
                                     for (m, k, n), r in zip(shapes, rates_run)) + " GFLOP/s")
    w(f"; the bound below uses the best of the run's precision, {peak:.0f} GFLOP/s (a lower "
      f"bound: some products run in float32).\n\n")
    w("| stage | seconds | share | pairs/s alone | MFLOP/pair (matrix products) | "
      "bound s at the GEMM rate | time / bound |\n|---|---|---|---|---|---|---|\n")
    total_flops = 0.0
    for name in STAGES:
        seconds = clock.seconds.get(name, 0.0)
        flops = counted.flops.get(name, 0) * scale
        total_flops += flops
        bound = flops / (peak * 1e9)
        w(f"| {name} | {seconds:.1f} | {100 * seconds / wall:.1f} % | "
          f"{len(encoded) / seconds if seconds else float('inf'):,.0f} | "
          f"{flops / len(encoded) / 1e6:.1f} | {bound:.1f} | "
          f"{seconds / bound if bound else float('nan'):.1f}x |\n")
    bound = total_flops / (peak * 1e9)
    w(f"| **all** | {wall:.1f} | 100 % | {len(encoded) / wall:.0f} | "
      f"{total_flops / len(encoded) / 1e6:.1f} | {bound:.1f} | {wall / bound:.1f}x |\n\n")
    w(f"Arithmetic bound: {total_flops / len(encoded) / 1e6:.0f} MFLOP per pair at "
      f"{peak:.0f} GFLOP/s = **{len(encoded) / bound:,.0f} pairs/s**; measured "
      f"{len(encoded) / wall:.0f} pairs/s, {wall / bound:.1f}x the bound.\n")


if __name__ == "__main__":
    main()
