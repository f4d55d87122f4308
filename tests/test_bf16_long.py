"""bf16 autocast on long sentences (150 target x 150 source positions), on the CPU (and on a
CUDA GPU where torch sees one: the ``device`` parameter, ``pytest -m cuda``), against fp32; and
``--precision`` of training (aligner/precision.py, aligner/training/loop.py).

What stays float32 under autocast (aligner/precision.py): the HMM forward–backward (its
batched matrix–vector products run with autocast off) and the linear lexicon's normalizer.
Measured on this machine before that (5 seeds, the inputs of the tests below): the
forward–backward's posteriors were off by up to 0.0044 under bf16 autocast, now by exactly 0.

Tolerances, measured over 5 seeds with the inputs below (worst case, then the bound):
* linear lexicon log p_lex, bf16 autocast vs fp32: 0.091 (its logits a_i, b_j come out of
  bf16 matmuls on purpose: 8 significant bits of logits of magnitude ~10) -> 0.2;
* a randomly initialized hmm1 (linear lexicon) on a 150 x 150 pair: NLL per target token
  off by 5.2e-4 (relative 7.8e-5) -> 2e-3; posteriors off by at most 3.3e-4 -> 2e-3.
"""
from __future__ import annotations

import pytest
import torch

from aligner import constants as C
from aligner.config import TrainConfig
from aligner.models import build_model
from aligner.models.direct_hmm import linear_lexicon_log_probs
from aligner.models.hmm_algorithms import forward_backward
from aligner.precision import choose_precision
from aligner.utils import AlignerError

I = J = 150
LEXICON_TOLERANCE = 0.2
NLL_PER_TOKEN_TOLERANCE = 2e-3
POSTERIOR_TOLERANCE = 2e-3


#: where the checks run: the CPU always, a CUDA GPU where torch sees one
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]


def bf16(device: str = "cpu"):
    """bf16 autocast on `device` ("cpu" or "cuda")."""
    return torch.autocast(device, dtype=torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_backward_stays_float32_under_autocast(device):
    """Sharp random emissions and transitions (the case where rounding α and β hurts): the
    posteriors under bf16 autocast are those of fp32, bit for bit."""
    g = torch.Generator().manual_seed(0)
    emission = (torch.randn(2, I, J, generator=g) * 3).to(device)
    initial = torch.log_softmax(torch.randn(2, J, generator=g), -1).to(device)
    transition = torch.log_softmax(torch.randn(2, I, J, J, generator=g) * 3, -1).to(device)
    lengths = torch.tensor([I, I - 17], device=device)
    reference = forward_backward(emission, initial, transition, lengths)
    with bf16(device):
        got = forward_backward(emission, initial, transition, lengths)
        chunked = forward_backward(emission, initial, transition, lengths, chunk=32)
    assert got.dtype == torch.float32
    assert torch.equal(got, reference)
    assert torch.allclose(chunked, reference, atol=1e-6)


def test_linear_lexicon_under_autocast_is_close_to_fp32():
    g = torch.Generator().manual_seed(1)
    k, vocab = 64, 8000
    source, target = torch.randn(2, J, k, generator=g), torch.randn(2, I, k, generator=g)
    weight, bias = torch.randn(vocab, k, generator=g) * 0.3, torch.randn(vocab, generator=g)
    words = torch.randint(0, vocab, (2, I), generator=g)
    with torch.no_grad():
        reference = linear_lexicon_log_probs(source, target, weight, bias, words)
        with bf16():
            got = linear_lexicon_log_probs(source, target, weight, bias, words)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    assert (got - reference).abs().max().item() < LEXICON_TOLERANCE


@pytest.mark.parametrize("device", DEVICES)
def test_hmm1_on_a_150_by_150_pair_bf16_against_fp32(device):
    torch.manual_seed(3)
    g = torch.Generator().manual_seed(3)
    vocab = 600
    model = build_model("hmm1", dict(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=64,
                                     n_heads=4, enc_layers=2, dec_layers=2, d_ff=128,
                                     dropout=0.0, max_positions=400, lexicon_dim=32,
                                     lexicon_activation="linear")).eval().to(device)
    src = torch.cat([torch.randint(4, vocab, (1, J - 1), generator=g),
                     torch.full((1, 1), C.EOS_ID)], 1)
    words = torch.randint(4, vocab, (1, I - 1), generator=g)
    tgt_in = torch.cat([torch.full((1, 1), C.BOS_ID), words], 1)
    tgt_out = torch.cat([words, torch.full((1, 1), C.EOS_ID)], 1)
    src, tgt_in, tgt_out = src.to(device), tgt_in.to(device), tgt_out.to(device)
    with torch.no_grad():
        nll, tokens = model.loss(src, tgt_in, tgt_out)
        posterior = model.alignment_scores(src, tgt_in, tgt_out, "hmm-posterior")
        with bf16(device):
            nll_bf16, _ = model.loss(src, tgt_in, tgt_out)
            posterior_bf16 = model.alignment_scores(src, tgt_in, tgt_out, "hmm-posterior")
    assert posterior.shape == (1, I, J)
    assert abs(float(nll_bf16) - float(nll)) / int(tokens) < NLL_PER_TOKEN_TOLERANCE
    assert (posterior_bf16.float() - posterior).abs().max().item() < POSTERIOR_TOLERANCE
    assert torch.allclose(posterior_bf16.float().sum(-1), posterior.sum(-1), atol=1e-4)


# -- --precision of training ------------------------------------------------------------------

@pytest.mark.parametrize("name, device, native, emulated, expected", [
    ("auto", "cuda:0", True, True, "bf16"),     # A100, H100: compute capability >= 8
    ("auto", "cuda:0", False, True, "fp32"),    # V100, T4: bf16 only emulated
    ("bf16", "cuda:0", False, True, "bf16"),    # asked for: emulated is accepted
    ("auto", "cpu", False, False, "fp32"),      # CPU stays fp32 unless asked
    ("bf16", "cpu", False, False, "bf16"),
    ("fp32", "cuda:0", True, True, "fp32"),
])
def test_choose_precision(name, device, native, emulated, expected):
    assert choose_precision(name, torch.device(device), native, emulated) == expected


def test_bf16_without_bf16_and_unknown_names_are_one_line_errors():
    with pytest.raises(AlignerError, match="^--precision bf16: not supported on device 'cuda:1'"):
        choose_precision("bf16", torch.device("cuda", 1), False, False)
    with pytest.raises(AlignerError, match="^--precision must be one of auto, fp32, bf16 "
                                           "\\(got 'fp16'\\)$"):
        TrainConfig(max_updates=1, precision="fp16")


def test_align_train_precision_bf16_on_cpu(tmp_path):
    """--precision is an option of align train (and align run); bf16 trains on the CPU under
    autocast (the log says so), is recorded in config.json, and may change on --resume."""
    import json

    from cli_runner import run
    from synthetic import monotone_corpus, write_corpus
    from test_cli_train_extract import TINY

    assert "--precision [auto|fp32|bf16]" in run("train", "--help").output
    assert "--precision [auto|fp32|bf16]" in run("run", "--help").output
    sources, targets, golds = monotone_corpus(40, seed=4)
    src, tgt, _ = write_corpus(tmp_path, "train", sources, targets, golds)
    model = tmp_path / "model"
    args = ["train", "-s", src, "-t", tgt, "-o", model, *TINY, "--device", "cpu",
            "--directions", "fwd"]
    run(*args, "--max-updates", 2, "--precision", "bf16")
    assert "device cpu (bf16), 1 process(es)" in (model / C.LOG_NAME).read_text()
    saved = json.loads((model / C.CONFIG_NAME).read_text())["training"]
    assert saved["precision"] == "bf16"
    loss = [float(row.split("\t")[2]) for row in
            (model / "fwd" / C.METRICS_NAME).read_text().splitlines()[1:]]
    assert loss and all(0 < value < 20 for value in loss)
    run(*args, "--max-updates", 4, "--precision", "fp32", "--resume")
    assert "device cpu (fp32), 1 process(es)" in (model / C.LOG_NAME).read_text()
    # other values: click's usage error (exit 2), no traceback
    result = run("train", "-s", src, "-t", tgt, "-o", tmp_path / "m2", "--precision", "fp16",
                 ok=False)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "'fp16' is not one of 'auto', 'fp32', 'bf16'" in result.output
