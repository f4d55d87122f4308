"""Inference precision (aligner/precision.py: fp32 / bf16 autocast) and the hmm decoding
lexicon chunked over source positions (aligner/models/direct_hmm.py: mixture_log_probs).

bf16 is exercised with CPU autocast (torch.autocast("cpu", dtype=torch.bfloat16)); CUDA
autocast differs only in which ops it casts (it also promotes softmax and layer norm to
float32), so the CPU checks are the stricter ones.

Tolerances. bfloat16 keeps 8 significant bits: one rounding moves a value by up to 2^-9 (0.2 %)
of itself. On the tiny trained models below a log-score that went through a few bf16 matmuls
and layer norms is off by up to 0.03 (transformer logits, magnitude <= 6), 0.06 (hmm0 log α)
and 0.08 (log p_lex, magnitude <= 20); measured with scripts like this file's, on CPU.
A probability moves by at most a quarter of its log-score's error (d softmax / d logit
<= p(1-p) <= 1/4); a posterior ∝ α·p_lex combines two such errors: <= (0.06 + 0.08)/4 = 0.035,
so SOFT_TOLERANCE = 0.04 (measured worst case over all kinds and methods: 0.015). layer-sgd
adds three gradient steps (lr 1) on the attention, each gradient computed through bf16
matmuls and off by a few % of itself: its errors compound, and after renormalization the
measured worst case is 0.014 with this machine's avx512_bf16 kernels but 0.069 with
ATEN_CPU_CAPABILITY=default (plain kernels, as on CPUs without bf16 units; mean 0.0007):
SGD_SOFT_TOLERANCE = 0.1.
A hypothesis' log-probability adds one log p(e) error per output token, at worst the largest
log-score error (~0.1), in practice much less because roundings partly cancel (measured
<= 0.005 per token): LOG_PROB_TOLERANCE_PER_TOKEN = 0.03. Hard links are argmaxes and flip
only at near-ties: they must agree for >= 95 % of the links (measured >= 99 %).
"""
from __future__ import annotations

import math
import random
from typing import List, Tuple

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from aligner import constants as C
from aligner.api import Aligner
from aligner.cli import main
from aligner.data import EncodedPair
from aligner.extract.inference import align_pairs, extract, soft_alignments
from aligner.formats import read_bitext
from aligner.model_dir import LoadedModelDir
from aligner.models import build_model
from aligner.models.alignment_layer import AlignmentLayerConfig, AlignmentLayerModel
from aligner.models.direct_hmm import mixture_log_probs
from aligner.precision import PRECISIONS, autocast_context, resolve_precision
from aligner.translate import beam_search, translate
from aligner.utils import AlignerError

from test_translate import SRC_TEXT, TGT_TEXT, full_log_prob, make_model_dir, sources, tiny

CPU = torch.device("cpu")
KINDS = ("transformer", "hmm0", "hmm1", "alignment-layer")
VOCAB = 24                  # ids 4..13 source words, 14..23 target words (source + 10)
SOFT_TOLERANCE = 0.04
SGD_SOFT_TOLERANCE = 0.1
LOG_PROB_TOLERANCE_PER_TOKEN = 0.03
LINK_AGREEMENT = 0.95


# -- tiny models trained on a reversal task -----------------------------------------------------

def reversal_pairs(rng: random.Random, n: int) -> List[Tuple[List[int], List[int]]]:
    """Source: 3..6 distinct words from 4..13; target: each word + 10, in reverse order.
    Gold alignment: target i <-> source L-1-i."""
    pairs = []
    for _ in range(n):
        words = rng.sample(range(4, 14), rng.randint(3, 6))
        pairs.append((words, [w + 10 for w in reversed(words)]))
    return pairs


def tensors(pairs) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """src (B, J+1), tgt_in (B, I+1), tgt_out (B, I+1), right-padded."""
    src = sources(*[s for s, _ in pairs])
    width = max(len(t) for _, t in pairs) + 1
    tgt_in = torch.full((len(pairs), width), C.PAD_ID)
    tgt_out = torch.full((len(pairs), width), C.PAD_ID)
    for row, (_, target) in enumerate(pairs):
        tgt_in[row, :len(target) + 1] = torch.tensor([C.BOS_ID] + target)
        tgt_out[row, :len(target) + 1] = torch.tensor(target + [C.EOS_ID])
    return src, tgt_in, tgt_out


def fit(model, steps: int, seed: int):
    rng = random.Random(seed)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(steps):
        loss, n_tokens = model.loss(*tensors(reversal_pairs(rng, 16)))
        optimizer.zero_grad()
        (loss / n_tokens).backward()
        optimizer.step()
    return model.eval()


CONFIG = dict(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16, n_heads=2, enc_layers=1,
              dec_layers=2, d_ff=32, dropout=0.0, max_positions=16)
STEPS = 60


def train_models():
    """kind -> a tiny model trained on the reversal task (seeded; a few seconds in all)."""
    models = {}
    for kind in ("transformer", "hmm0", "hmm1"):
        torch.manual_seed(0)
        models[kind] = fit(build_model(kind, CONFIG), STEPS, seed=1)
    torch.manual_seed(0)
    layer = AlignmentLayerModel(AlignmentLayerConfig(**CONFIG, layer_dropout=0.0))
    layer.load_base(models["transformer"].state_dict())
    models["alignment-layer"] = fit(layer, STEPS // 2, seed=2)
    return models


@pytest.fixture(scope="module")
def trained():
    return train_models()


def encoded(pairs) -> List[EncodedPair]:
    """Pairs of id lists as EncodedPairs, one subword per word."""
    return [EncodedPair(np.array(s, dtype=np.int64), np.array(t, dtype=np.int64),
                        list(range(len(s))), list(range(len(t)))) for s, t in pairs]


# -- the helper --------------------------------------------------------------------------------

def test_resolve_precision_on_cpu_and_bad_values():
    assert resolve_precision("auto", CPU) == "fp32"         # training: auto = bf16 only on CUDA
    assert resolve_precision("fp32", CPU) == "fp32"
    assert resolve_precision("bf16", CPU) == "bf16"
    with pytest.raises(AlignerError, match="--precision must be one of auto, fp32, bf16"):
        resolve_precision("fp16", CPU)
    with pytest.raises(AlignerError, match="--precision bf16: not supported on device 'meta'"):
        resolve_precision("bf16", torch.device("meta"))


@pytest.mark.parametrize("flags,capability,native", [
    ("fpu sse2 avx512f avx512_bf16 amx_tile", "AVX512", True), ("fpu amx_bf16", "AVX512", True),
    ("fpu avx2 avx512f", "AVX512", False), (None, "AVX512", False),
    # bf16 instructions, but torch told not to use AVX-512 (ATEN_CPU_CAPABILITY=default / avx2)
    ("fpu avx512f avx512_bf16", "DEFAULT", False), ("fpu avx512f avx512_bf16", "AVX2", False)])
def test_inference_auto_is_bf16_on_a_cpu_with_bf16_instructions(tmp_path, monkeypatch, flags,
                                                                capability, native):
    """Inference (align extract, align run's final alignment): auto = bf16 where /proc/cpuinfo
    lists avx512_bf16 or amx_bf16 and torch runs its AVX-512 kernels; training's auto stays
    fp32 on every CPU."""
    from aligner import precision

    cpuinfo = tmp_path / "cpuinfo"
    if flags is not None:
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\n"
                           f"flags\t\t: {flags}\n")
    assert precision.cpu_native_bf16(str(cpuinfo), capability) == native
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: native)
    assert resolve_precision("auto", CPU, inference=True) == ("bf16" if native else "fp32")
    assert resolve_precision("auto", CPU) == "fp32"
    assert resolve_precision("fp32", CPU, inference=True) == "fp32"


@pytest.mark.parametrize("capability,auto,bf16_ok", [(8, "bf16", True), (7, "fp32", True),
                                                    (None, "fp32", False)])
def test_resolve_precision_on_cuda_by_compute_capability(monkeypatch, capability, auto,
                                                         bf16_ok):
    """A fake CUDA device: native bf16 from compute capability 8 (auto picks it), emulated
    below (only an explicit bf16 uses it), none at all (bf16 is a one-line error)."""
    import contextlib

    def is_bf16_supported(including_emulation=True):
        if capability is None:
            return False
        return capability >= 8 or including_emulation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda device=None: (capability or 0, 0))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    cuda = torch.device("cuda", 0)
    assert resolve_precision("auto", cuda) == auto
    assert resolve_precision("fp32", cuda) == "fp32"
    if bf16_ok:
        assert resolve_precision("bf16", cuda) == "bf16"
    else:
        with pytest.raises(AlignerError, match="not supported on device 'cuda:0'"):
            resolve_precision("bf16", cuda)


def test_autocast_context_switches_bf16_matmuls_on_and_off():
    layer, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    with autocast_context("fp32", CPU):
        assert not torch.is_autocast_enabled("cpu") and layer(x).dtype == torch.float32
    with autocast_context("bf16", CPU):
        assert torch.is_autocast_enabled("cpu")
        assert layer(x).dtype == torch.bfloat16
    assert layer(x).dtype == torch.float32                     # nothing leaks out
    with autocast_context("auto", CPU):                  # CPU, training's auto: fp32
        assert layer(x).dtype == torch.float32


def test_the_cli_choices_are_the_helpers():
    from aligner.cli import extract, translate as translate_cli
    for command in (extract.command, translate_cli.command):
        option = next(p for p in command.params if p.name == "precision")
        assert tuple(option.type.choices) == PRECISIONS and option.default == "auto"


# -- bf16 against fp32 on the trained models ---------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_bf16_extraction_is_close_to_fp32(trained, kind):
    """Every method: word-level soft alignments within SOFT_TOLERANCE, float32 either way;
    hard links agree for >= LINK_AGREEMENT of the target words."""
    model = trained[kind]
    pairs = encoded(reversal_pairs(random.Random(7), 48))
    differs = False
    for method in model.METHODS:
        soft32 = soft_alignments(model, pairs, "fwd", method)
        links32 = align_pairs(model, pairs, "fwd", method)
        with autocast_context("bf16", CPU):
            soft16 = soft_alignments(model, pairs, "fwd", method)
            links16 = align_pairs(model, pairs, "fwd", method)
        assert all(m.dtype == np.float32 for m in soft16)
        worst = max(float(np.abs(a - b).max()) for a, b in zip(soft32, soft16))
        assert worst <= (SGD_SOFT_TOLERANCE if method == "layer-sgd" else SOFT_TOLERANCE), (
            method, worst)
        differs |= worst > 0
        common = sum(len(a & b) for a, b in zip(links32, links16))
        either = sum(len(a | b) for a, b in zip(links32, links16))
        assert common / either >= LINK_AGREEMENT, (method, common, either)
    assert differs, "bf16 changed nothing: autocast did not reach the model"


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_beam_search_log_probs_are_float32_and_close_to_fp32(trained, kind):
    """decode_step's log-probabilities stay float32 under autocast; each bf16 hypothesis'
    log-probability is within LOG_PROB_TOLERANCE_PER_TOKEN per token of the fp32 model's score
    of the same output. The trained hmm models find the same outputs in both precisions (all
    8 measured; one flip is allowed for CPUs with other bf16 kernels); the barely trained
    transformer (flat distributions: near-ties early in the search send the beam down other
    paths) at least half of them (measured 6/8)."""
    model = trained[kind]
    pairs = reversal_pairs(random.Random(8), 8)
    src = sources(*[s for s, _ in pairs])
    limits = [len(s) + 3 for s, _ in pairs]
    fp32 = beam_search(model, src, limits, beam=3)
    with autocast_context("bf16", CPU):
        bf16 = beam_search(model, src, limits, beam=3)
        state = model.init_decode_state(src)
        log_p, state = model.decode_step(state, torch.full((len(pairs),), C.BOS_ID))
        assert log_p.dtype == torch.float32
        if kind == "hmm1":                    # the forward state q is float32 as well
            words = torch.full((len(pairs),), 14)
            state = model.reorder_decode_state(state, torch.arange(len(pairs)))
            assert model.decode_step(state, words)[1]["forward"].dtype == torch.float32
    scorer = model.base if kind == "alignment-layer" else model
    tolerance = LOG_PROB_TOLERANCE_PER_TOKEN
    for row, (a, b) in enumerate(zip(fp32, bf16)):
        assert isinstance(b.log_prob, float) and math.isfinite(b.log_prob)
        length = len(b.tokens) + 1                                   # EOS included
        exact = full_log_prob(scorer, src[row], b.tokens, True)       # fp32, whole sequence
        assert abs(b.log_prob - exact) <= tolerance * length
        if a.tokens == b.tokens:
            assert abs(a.log_prob - b.log_prob) <= tolerance * length
    same = sum(a.tokens == b.tokens for a, b in zip(fp32, bf16))
    assert same >= (len(pairs) - 1 if kind.startswith("hmm") else len(pairs) // 2)


# -- the hmm decoding lexicon, chunked over source positions -----------------------------------

def mixture_by_brute_force(log_prior, source_hidden, target_hidden, weight, bias):
    """The whole (N, J+1, V) lexicon at once (what hmm decoding did before chunking)."""
    hidden = torch.relu(source_hidden + target_hidden[:, None, :])
    log_lex = torch.log_softmax(torch.nn.functional.linear(hidden, weight, bias), dim=-1)
    return (torch.logsumexp(log_prior[:, :, None] + log_lex, dim=1),
            torch.logsumexp(torch.nn.functional.linear(hidden, weight, bias), dim=-1))


@pytest.mark.parametrize("positions", [1, 2, 3, 7, 100])
@pytest.mark.parametrize("with_bias", [True, False])
def test_mixture_log_probs_in_chunks_equals_the_whole_lexicon(positions, with_bias):
    generator = torch.Generator().manual_seed(positions)
    rows, states, k, vocab = 4, 7, 5, 9
    log_prior = torch.log_softmax(torch.randn(rows, states, generator=generator), dim=-1)
    log_prior[1, 4:] = -math.inf            # a padded sentence: whole chunks are all -inf
    log_prior[1] = torch.log_softmax(log_prior[1], dim=-1)
    source_hidden = torch.randn(rows, states, k, generator=generator)
    target_hidden = torch.randn(rows, k, generator=generator)
    weight = torch.randn(vocab, k, generator=generator)
    bias = torch.randn(vocab, generator=generator) if with_bias else None
    log_p, log_norm = mixture_log_probs(log_prior, source_hidden, target_hidden, weight, bias,
                                        positions)
    expected_p, expected_norm = mixture_by_brute_force(log_prior, source_hidden, target_hidden,
                                                       weight, bias)
    assert log_p.shape == (rows, vocab) and log_norm.shape == (rows, states)
    torch.testing.assert_close(log_p, expected_p, atol=1e-5, rtol=0)
    torch.testing.assert_close(log_norm, expected_norm, atol=1e-5, rtol=0)
    assert torch.logsumexp(log_p, dim=-1).abs().max() < 1e-5     # a distribution over V


def test_mixture_log_probs_under_bf16_autocast_is_float32_and_close():
    generator = torch.Generator().manual_seed(0)
    log_prior = torch.log_softmax(torch.randn(3, 6, generator=generator), dim=-1)
    source_hidden, target_hidden = torch.randn(3, 6, 8, generator=generator), torch.randn(3, 8)
    weight, bias = torch.randn(20, 8, generator=generator), torch.randn(20, generator=generator)
    exact, _ = mixture_log_probs(log_prior, source_hidden, target_hidden, weight, bias, 2)
    with autocast_context("bf16", CPU):
        log_p, log_norm = mixture_log_probs(log_prior, source_hidden, target_hidden, weight,
                                            bias, 2)
    assert log_p.dtype == log_norm.dtype == torch.float32
    assert 0 < float((log_p - exact).abs().max()) <= 0.1       # logits |x| <~ 10: 2^-8 · 10 · 2


@pytest.mark.parametrize("chunk_floats,expected", [(1, 1), (3 * 6 * 11, 3), (3 * 6 * 11 + 65, 3),
                                                   (10 ** 6, 10 ** 6 // 66)])
def test_positions_per_chunk_follow_chunk_floats(monkeypatch, chunk_floats, expected):
    """positions = max(1, chunk_floats // (N · V)): N = 6 rows, V = 11 words."""
    import aligner.models.direct_hmm as direct_hmm_module
    seen = []

    def spy(*args):
        seen.append(args[5])              # (log_prior, source, target, W4, bias, positions, ...)
        return mixture_log_probs(*args)

    monkeypatch.setattr(direct_hmm_module, "mixture_log_probs", spy)
    model = tiny("hmm0")
    state = model.init_decode_state(
        sources([5, 6, 7], [8, 9, 10, 11, 12], [4], [5, 5], [6], [7, 8]),
        lexicon_floats=chunk_floats)
    with torch.no_grad():
        model.decode_step(state, torch.full((6,), C.BOS_ID))
    assert seen == [expected]


def hmm_models(trained):
    """Random (tiny, from test_translate) and trained direct HMMs of both orders."""
    return [tiny("hmm0", seed=1), tiny("hmm1", seed=1), tiny("hmm1", markov_order=2, seed=2),
            trained["hmm0"], trained["hmm1"]]


def test_chunked_decoding_equals_unchunked_decoding(trained):
    """chunk_floats = 1: one source position per chunk; 2·6·V: 2 positions while 6 beam rows
    are alive, 4 once one sentence is done; default: one chunk (the whole lexicon)."""
    for model in hmm_models(trained):
        vocab = model.config.tgt_vocab_size
        src = sources([5, 6, 7, 8, 9], [10, 11], [4, 12, 5])
        limits = [8, 5, 6]
        whole = beam_search(model, src, limits, beam=2)
        assert model.init_decode_state(src)["lexicon_floats"] >= 6 * src.size(1) * vocab
        for chunk_floats in (1, 2 * 6 * vocab):
            chunked = beam_search(model, src, limits, beam=2,
                                  decode_options={"lexicon_floats": chunk_floats})
            assert [h.tokens for h in chunked] == [h.tokens for h in whole]
            assert [h.log_prob for h in chunked] == pytest.approx(
                [h.log_prob for h in whole], abs=1e-5)


@pytest.mark.parametrize("markov_order", [0, 2])
def test_chunked_hmm1_decoding_sums_to_log_z(markov_order):
    """With one source position per chunk and the chosen words' lexicon entries recomputed in
    the forward state update, each hypothesis' log-probability is still log Z of the forward
    algorithm."""
    model = tiny("hmm1", markov_order, seed=4)
    src = sources([5, 6, 7, 8], [9, 10])
    hypotheses = beam_search(model, src, [7, 6], beam=3, decode_options={"lexicon_floats": 1})
    for row, hypothesis in enumerate(hypotheses):
        assert hypothesis.log_prob == pytest.approx(
            full_log_prob(model, src[row], hypothesis.tokens, True), abs=1e-4)


def test_hmm1_decoding_state_holds_no_lexicon_sized_tensor():
    """Before chunking, the state kept a pending (N, J+1, V) log-lexicon for the forward
    update. Now no tensor of the state has both a source-position and a vocabulary axis."""
    torch.manual_seed(0)
    model = build_model("hmm1", dict(src_vocab_size=13, tgt_vocab_size=50, d_model=16,
                                     n_heads=2, enc_layers=1, dec_layers=1, d_ff=32,
                                     dropout=0.0, max_positions=40)).eval()
    src = sources([5, 6, 7, 8, 9, 10, 11])                  # J+1 = 8
    state = model.init_decode_state(src, lexicon_floats=1)
    with torch.no_grad():
        _, state = model.decode_step(state, torch.tensor([C.BOS_ID]))
        shapes = [tuple(t.shape) for value in state.values()
                  for t in (value if isinstance(value, (list, tuple)) else [value])
                  if isinstance(t, torch.Tensor)]
        assert any(8 in shape for shape in shapes)
        assert not any(8 in shape and 50 in shape for shape in shapes), shapes
        _, kept = model.decode_step(model.reorder_decode_state(state, torch.tensor([0])),
                                    torch.tensor([7]))
    assert kept["forward"].shape == (1, 8)
    assert float(kept["forward"].exp().sum()) == pytest.approx(1.0, abs=1e-5)


# -- the commands and the Python API --------------------------------------------------------------

def run(args):
    """(exit code, stdout, stderr) of `align ARGS`."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_translate_precision_fp32_is_the_plain_output_and_bf16_runs(tmp_path, kind):
    model_dir = make_model_dir(tmp_path / "model", kind)
    lines = SRC_TEXT + ["", "house small the"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    loaded = LoadedModelDir.load(model_dir, ("fwd",))
    plain = translate(loaded, lines, "fwd", beam=3, print_alignment=True)   # no autocast
    expected = "".join(f"{r.text} ||| {' '.join(f'{i}-{j}' for i, j in sorted(r.links))}\n"
                       for r in plain)
    args = ["translate", model_dir, "-i", tmp_path / "in.txt", "--beam", 3,
            "--print-alignment", "--threads", 1, "-q"]
    outputs = {}
    for precision in (None, "fp32", "bf16"):
        code, outputs[precision], errors = run(
            args + ([] if precision is None else ["--precision", precision]))
        assert code == 0, errors
    assert outputs["fp32"] == expected == outputs[None]       # auto = fp32 on CPU: unchanged
    got = outputs["bf16"].split("\n")
    assert len(got) == len(lines) + 1 and got[-1] == "" and got[len(SRC_TEXT)] == " ||| "
    for line, output in zip(lines, got):
        words, links = output.split(" ||| ")
        assert all(0 <= int(link.split("-")[0]) < len(line.split()) and
                   0 <= int(link.split("-")[1]) < len(words.split()) for link in links.split())


@pytest.mark.parametrize("kind", ["hmm0", "hmm1", "alignment-layer"])
def test_extract_precision_fp32_is_the_plain_output_and_bf16_is_close(tmp_path, kind):
    model_dir = make_model_dir(tmp_path / "model", kind)
    (tmp_path / "src").write_text("\n".join(SRC_TEXT) + "\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("\n".join(TGT_TEXT) + "\n", encoding="utf-8")
    plain = extract(LoadedModelDir.load(model_dir), read_bitext(str(tmp_path / "src"),
                                                                str(tmp_path / "tgt")),
                    "hmm-posterior" if kind.startswith("hmm") else "layer-sgd")
    soft = {}
    for precision in ("fp32", "bf16"):
        out, npz = tmp_path / f"{precision}.txt", tmp_path / f"{precision}.npz"
        code, _, errors = run(["extract", model_dir, "-s", tmp_path / "src", "-t",
                               tmp_path / "tgt", "-o", out, "--soft", npz, "--precision",
                               precision, "-H", "grow-diag", "-q"])
        assert code == 0, errors
        lines = out.read_text(encoding="utf-8").split("\n")
        assert len(lines) == len(SRC_TEXT) + 1
        if precision == "fp32":
            assert lines[:-1] == [" ".join(f"{i}-{j}" for i, j in sorted(links))
                                  for links in plain]
        with np.load(npz) as arrays:
            soft[precision] = {name: arrays[name] for name in arrays.files}
    assert soft["fp32"].keys() == soft["bf16"].keys()
    worst = max(float(np.abs(soft["fp32"][k] - soft["bf16"][k]).max()) for k in soft["fp32"])
    assert all(a.dtype == np.float32 for a in soft["bf16"].values())
    tolerance = SGD_SOFT_TOLERANCE if kind == "alignment-layer" else SOFT_TOLERANCE
    assert 0 < worst <= tolerance, worst               # > 0: bf16 did reach the model


def test_api_precision(tmp_path):
    model_dir = make_model_dir(tmp_path / "model", "transformer")
    fp32 = Aligner.load(model_dir, device="cpu", precision="fp32")
    bf16 = Aligner.load(model_dir, device="cpu", precision="bf16")
    assert (fp32.precision, bf16.precision) == ("fp32", "bf16")
    # auto: as align extract's, bf16 on a CPU with bfloat16 instructions
    assert Aligner.load(model_dir, device="cpu").precision == resolve_precision(
        "auto", CPU, inference=True)
    got32 = fp32.align(SRC_TEXT, TGT_TEXT, return_probabilities=True)
    got16 = bf16.align(SRC_TEXT, TGT_TEXT, return_probabilities=True)
    worst = max(float(np.abs(a[1][d] - b[1][d]).max())
                for a, b in zip(got32, got16) for d in ("fwd", "rev"))
    assert 0 < worst <= SOFT_TOLERANCE
    assert not torch.is_autocast_enabled("cpu")             # the context ended with align()
    with pytest.raises(AlignerError, match="--precision must be one of"):
        Aligner.load(model_dir, device="cpu", precision="fp16")


def test_extract_and_the_api_default_to_the_recipes_lexicon_shortlist(tmp_path, monkeypatch):
    """align extract (and Aligner.align) of an hmm: the lexicon shortlist of the recipe unless
    -O shortlist=N is given (0: exact); the transformer's methods take no shortlist."""
    from aligner.training import recipe

    model_dir = make_model_dir(tmp_path / "model", "hmm1")
    monkeypatch.setattr(recipe, "SHORTLIST", 8)      # below the tiny model's vocabulary
    (tmp_path / "s.txt").write_text("\n".join(SRC_TEXT) + "\n", encoding="utf-8")
    (tmp_path / "t.txt").write_text("\n".join(TGT_TEXT) + "\n", encoding="utf-8")
    soft = {}
    for name, extra in (("default", []), ("eight", ["-O", "shortlist=8"]),
                        ("exact", ["-O", "shortlist=0"])):
        code, _, errors = run(["extract", model_dir, "-s", tmp_path / "s.txt", "-t",
                               tmp_path / "t.txt", "-o", tmp_path / f"{name}.align",
                               "--soft", tmp_path / f"{name}.npz", "--precision", "fp32",
                               "-q"] + extra)
        assert code == 0, errors
        with np.load(tmp_path / f"{name}.npz") as arrays:
            soft[name] = {key: arrays[key] for key in arrays.files}
    assert all(np.array_equal(soft["default"][k], soft["eight"][k]) for k in soft["eight"])
    assert any(not np.allclose(soft["default"][k], soft["exact"][k]) for k in soft["exact"])
    api = Aligner.load(model_dir, device="cpu", precision="fp32")
    by_default = api.align(SRC_TEXT, TGT_TEXT, return_probabilities=True)
    eight = api.align(SRC_TEXT, TGT_TEXT, return_probabilities=True, shortlist=8)
    assert all(np.array_equal(a[1][d], b[1][d]) for a, b in zip(by_default, eight)
               for d in ("fwd", "rev"))
