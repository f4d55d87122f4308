"""`align train` / `align extract` / `align demo` through click: round trip, resume, errors,
pinned defaults."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from aligner import constants as C
from aligner.formats import read_pharaoh
from aligner.training import recipe
from cli_runner import error_line, run
from synthetic import monotone_corpus, write_corpus

TINY = ["--model", "transformer", "--bpe-merges", "20", "--d-model", "16", "--heads", "2", "--encoder-layers", "1",
        "--decoder-layers", "1", "--ff-dim", "32", "--max-tokens", "200", "--warmup", "2",
        "--lr", "3e-3", "--checkpoint-interval", "2", "-q"]


@pytest.fixture
def corpus(tmp_path):
    sources, targets, golds = monotone_corpus(40, seed=4)
    src, tgt, gold = write_corpus(tmp_path, "train", sources, targets, golds)
    vsrc, vtgt, vgold = write_corpus(tmp_path, "valid", sources[:6], targets[:6], golds[:6])
    return dict(src=src, tgt=tgt, gold=gold, vsrc=vsrc, vtgt=vtgt, vgold=vgold,
                sources=sources, targets=targets)


def test_round_trip_train_extract_symmetrize_score(tmp_path, corpus):
    model = tmp_path / "model"
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model, "--max-updates", 3,
        "--valid-src", corpus["vsrc"], "--valid-tgt", corpus["vtgt"], "--valid-gold",
        corpus["vgold"], *TINY)
    for name in (C.CONFIG_NAME, C.VOCAB_SRC, C.VOCAB_TGT, C.BPE_CODES_SRC, C.LOG_NAME,
                 "prep.json", "fwd/params.best.pt", "rev/params.last.pt",
                 "rev/training_state.pt", "fwd/metrics.tsv"):
        assert (model / name).exists(), name
    config = json.loads((model / C.CONFIG_NAME).read_text())
    assert config["model_kind"] == "transformer" and config["directions"] == ["fwd", "rev"]
    assert config["models"]["fwd"]["src_vocab_size"] == config["models"]["rev"]["tgt_vocab_size"]
    assert config["training"]["max_updates"] == 3 and config["seed"] == C.DEFAULT_SEED
    header, *rows = (model / "fwd" / C.METRICS_NAME).read_text().splitlines()
    assert [row.split("\t")[0] for row in rows] == ["2", "3"]
    assert all(row.split("\t")[5] not in ("-", "nan") for row in rows)  # validation AER

    outputs = {}
    for direction in ("fwd", "rev", "both"):
        outputs[direction] = tmp_path / f"{direction}.txt"
        run("extract", model, "-s", corpus["vsrc"], "-t", corpus["vtgt"], "--direction",
            direction, "-o", outputs[direction], "-q")
    run("symmetrize", "-f", outputs["fwd"], "-r", outputs["rev"], "-H", "grow-diag", "-o",
        tmp_path / "sym.txt", "-q")
    assert (tmp_path / "sym.txt").read_text() == outputs["both"].read_text()
    for path in outputs.values():
        alignments = read_pharaoh(str(path))
        assert len(alignments) == 6
        for links, src, tgt in zip(alignments, corpus["sources"], corpus["targets"]):
            assert all(i < len(src) and j < len(tgt) for i, j in links)
    # fwd: every target word is linked exactly once (one argmax per target word)
    for links, tgt in zip(read_pharaoh(str(outputs["fwd"])), corpus["targets"]):
        assert sorted(j for _, j in links) == list(range(len(tgt)))
    score = run("score-aer", "-g", corpus["vgold"], "-a", outputs["both"])
    assert re.search(r"AER \d+\.\d", score.output)


def test_subword_pooling_of_the_soft_matrices_and_their_links(tmp_path, corpus):
    """--subword-pooling mean / max (default max) on a model with BPE: a word's row in the
    --soft matrices is its subwords' mean or maximum, so max >= mean everywhere, the two
    differ where a word has subwords, each fwd column sums to 1 under the mean; each output
    is soft-average of its own matrices."""
    from aligner.links.soft_symmetrize import soft_average_corpus

    model = tmp_path / "model"
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model, "--max-updates", 3,
        *TINY)
    matrices = {}
    for pooling in ("mean", "max", None):
        name = pooling or "default"
        out, soft = tmp_path / f"{name}.align", tmp_path / f"{name}.npz"
        run("extract", model, "-s", corpus["src"], "-t", corpus["tgt"], "-H", "soft-average",
            "--threshold", "0.3", "-o", out, "--soft", soft, "-q",
            *(["--subword-pooling", pooling] if pooling else []))
        loaded = np.load(soft)
        matrices[name] = {d: [loaded[f"{d}_{k}"] for k in range(40)] for d in ("fwd", "rev")}
        assert read_pharaoh(str(out)) == soft_average_corpus(
            matrices[name]["fwd"], matrices[name]["rev"], 0.3)
    mean, high = matrices["mean"], matrices["max"]
    assert all(np.array_equal(a, b) for d in ("fwd", "rev")
               for a, b in zip(high[d], matrices["default"][d]))
    assert all(np.allclose(m.sum(axis=0), 1.0, atol=1e-5) for m in mean["fwd"])
    assert all(np.all(h >= m - 1e-6) for d in ("fwd", "rev") for h, m in zip(high[d], mean[d]))
    assert any(not np.allclose(h, m) for d in ("fwd", "rev") for h, m in zip(high[d], mean[d]))


def test_joint_input_and_stdout_and_blank_lines(tmp_path, corpus):
    joint = tmp_path / "train.joint"
    joint.write_text("".join(f"{' '.join(s)} ||| {' '.join(t)}\n"
                             for s, t in zip(corpus["sources"], corpus["targets"])))
    model = tmp_path / "model"
    run("train", "-i", joint, "-o", model, "--max-updates", 1, "--directions", "fwd", *TINY)
    assert not (model / "rev").exists()
    test = tmp_path / "test.joint"
    test.write_text("s1 s2 ||| t1 t2\n ||| t3\ns4 s4 s4 ||| \ns2 ||| t2\n")
    result = run("extract", model, "-i", test, "--direction", "fwd")
    lines = result.stdout.split("\n")
    assert len(lines) == 5 and lines[1] == "" and lines[2] == "" and lines[4] == ""
    assert lines[0] and lines[3] == "0-0"
    assert "test.joint:2: an empty side: writing an empty alignment" in result.stderr
    assert "test.joint:3: an empty side" in result.stderr


def test_resume_continues_and_refuses_changed_settings(tmp_path, corpus):
    model = tmp_path / "model"
    args = ["train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model, *TINY]
    run(*args, "--max-updates", 2)
    first = torch.load(model / "fwd" / C.PARAMS_LAST, weights_only=True)["state_dict"]
    run(*args, "--max-updates", 4, "--resume")
    rows = (model / "rev" / C.METRICS_NAME).read_text().splitlines()[1:]
    assert [row.split("\t")[0] for row in rows] == ["2", "4"]
    second = torch.load(model / "fwd" / C.PARAMS_LAST, weights_only=True)["state_dict"]
    assert any(not torch.equal(first[k], second[k]) for k in first)
    line = error_line(run(*args, "--max-updates", 6, "--resume", "--lr", "0.1", ok=False))
    assert "cannot resume, these settings differ from the saved run: training.lr" in line
    line = error_line(run(*args, "--max-updates", 6, ok=False))
    assert "directory is not empty; use --resume" in line
    run(*args, "--max-updates", 1, "--overwrite")
    rows = (model / "fwd" / C.METRICS_NAME).read_text().splitlines()[1:]
    assert [row.split("\t")[0] for row in rows] == ["1"]


def test_extract_in_blocks_equals_extract_at_once(tmp_path, corpus, monkeypatch):
    """Blocks of 3 lines (BLOCK_LINES patched): the same output for every heuristic, and a
    warning names the line of the whole file, not of its block."""
    import aligner.extract.inference

    model = tmp_path / "model"
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model, "--max-updates", 2,
        *TINY)
    lines = [(" ".join(s), " ".join(t)) for s, t in zip(corpus["sources"][:10],
                                                       corpus["targets"][:10])]
    lines[7] = (lines[7][0], "")
    test = tmp_path / "test.joint"
    test.write_text("".join(f"{s} ||| {t}\n" for s, t in lines))
    for heuristic in ("grow-diag", "soft-average"):
        whole = run("extract", model, "-i", test, "-H", heuristic, "-q").stdout
        monkeypatch.setattr(aligner.extract.inference, "BLOCK_LINES", 3)
        out = tmp_path / f"{heuristic}.txt"
        # (one process: the warnings of block processes go to their own stderr, which
        # tests/test_block_processes.py reads)
        blocks = run("extract", model, "-i", test, "-H", heuristic, "-o", out,
                     "--processes", "1")
        monkeypatch.setattr(aligner.extract.inference, "BLOCK_LINES", 50_000)
        assert out.read_text() == whole and len(whole.split("\n")) == 11
        assert "test.joint:8: an empty side" in blocks.stderr
        # one bar over the 10 lines (no log line per block); the parts beside -o are gone
        assert "10/10" in blocks.stderr and "lines 7-9" not in blocks.stderr
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(heuristic)) \
            == [out.name]


def test_train_user_errors_are_one_line(tmp_path, corpus):
    base = ["train", "-o", tmp_path / "m", *TINY, "--max-updates", "1"]
    short = tmp_path / "short.tgt"
    short.write_text("t1\n")
    cases = [
        (["-s", corpus["src"], "-t", short], "line counts differ"),
        (["-s", corpus["src"]], "give both -s/--source and -t/--target"),
        (["-s", corpus["src"], "-t", corpus["tgt"], "--model", "lstm"], "unknown model kind"),
        (["-s", corpus["src"], "-t", corpus["tgt"], "--directions", "fwd,up"], "--directions"),
        (["-s", corpus["src"], "-t", corpus["tgt"], "--valid-src", corpus["vsrc"]],
         "give both --valid-src and --valid-tgt"),
        (["-s", corpus["src"], "-t", corpus["tgt"], "--heads", "3"], "divisible"),
        (["-s", tmp_path / "missing.en", "-t", corpus["tgt"]], "missing.en: no such file"),
        (["-s", corpus["src"], "-t", corpus["tgt"], "-M", "nonsense"], "expects KEY=VALUE"),
    ]
    for args, message in cases:
        assert message in error_line(run(*base, *args, ok=False)), args
    if not torch.cuda.is_available():
        line = error_line(run(*base, "-s", corpus["src"], "-t", corpus["tgt"], "--device",
                              "cuda", ok=False))
        assert "--device cuda: CUDA is not available" in line


def test_extract_user_errors_are_one_line(tmp_path, corpus):
    model = tmp_path / "model"
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model, "--max-updates", 1,
        *TINY)
    base = ["extract", model, "-s", corpus["vsrc"], "-t", corpus["vtgt"]]
    assert "unknown method 'hmm-viterbi' for model kind 'transformer'" in error_line(
        run(*base, "--method", "hmm-viterbi", ok=False))
    assert "--layer must be between 1 and 1" in error_line(run(*base, "--layer", 2, ok=False))
    assert "--symmetrize combines two directions" in error_line(
        run(*base, "--direction", "fwd", "-H", "union", ok=False))
    assert "no such model directory" in error_line(
        run("extract", tmp_path / "nope", "-s", corpus["vsrc"], "-t", corpus["vtgt"], ok=False))
    (model / "rev" / C.PARAMS_BEST).unlink()
    assert "rev/params.best.pt: missing (model directory incomplete)" in error_line(
        run(*base, ok=False))
    run(*base, "--direction", "fwd", "--checkpoint", "last")  # fwd alone still works


def test_lr_schedule_option_is_recorded_and_followed(tmp_path, corpus):
    """--lr-schedule linear: config.json records it; the last update runs at lr / (T - w + 1)."""
    from aligner.training.loop import read_metrics

    model = tmp_path / "model"
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model, "--max-updates", 4,
        "--directions", "fwd", "--lr-schedule", "linear", *TINY)
    config = json.loads((model / C.CONFIG_NAME).read_text())
    assert config["training"]["lr_schedule"] == "linear"
    rows = read_metrics(str(model / "fwd" / C.METRICS_NAME))
    # TINY: --lr 3e-3 --warmup 2 --checkpoint-interval 2: updates 2 and 4
    assert [row["update"] for row in rows] == [2, 4]
    assert [row["lr"] for row in rows] == pytest.approx([3e-3, 3e-3 / 3])
    # resumed with another length, the decay would jump: refused (inverse-sqrt resumes)
    line = error_line(run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model,
                          "--max-updates", 8, "--directions", "fwd", "--lr-schedule", "linear",
                          "--resume", *TINY, ok=False))
    assert "cannot resume, these settings differ from the saved run: training.max_updates" in line


def test_pinned_train_defaults():
    """The defaults users and scripts rely on (sockeye's test_arguments idea)."""
    from aligner.cli.train import command

    defaults = {p.name: p.default for p in command.params}
    assert {k: defaults[k] for k in (
        "model_kind", "directions", "tokenize", "bpe_merges", "joint_bpe", "d_model", "heads",
        "encoder_layers", "decoder_layers", "ff_dim", "dropout", "max_tokens", "update_freq",
        "lr", "warmup", "lr_schedule", "label_smoothing", "clip_norm", "max_updates",
        "max_epochs", "checkpoint_interval", "device", "seed", "rounds")} == {
        "model_kind": "hmm1", "directions": "fwd,rev", "tokenize": False,
        "bpe_merges": None, "joint_bpe": True, "d_model": 128, "heads": 4,
        "encoder_layers": 3, "decoder_layers": 3, "ff_dim": 512, "dropout": 0.0,
        # resolved by the device (recipe.device_defaults: the CPU's are below)
        "max_tokens": None, "update_freq": 1, "lr": None, "warmup": None,
        # resolved: inverse-sqrt, linear in the guided alignment layer's own stage
        "lr_schedule": None, "label_smoothing": 0.1, "clip_norm": 1.0,
        "max_updates": 0, "max_epochs": None,
        "checkpoint_interval": 1000, "device": "auto", "seed": C.DEFAULT_SEED,
        "rounds": None}
    from aligner.training.recipe import device_defaults

    assert device_defaults("cpu") == dict(max_tokens=1200, lr=3e-3, warmup=150,
                                          chunk_floats=1 << 24)
    from aligner.cli.extract import command as extract_command

    defaults = {p.name: p.default for p in extract_command.params}
    assert defaults["direction"] == "both" and defaults["checkpoint"] == "best"


def test_demo_on_a_small_sample(tmp_path):
    sources, targets, golds = monotone_corpus(30, seed=2)
    sample = tmp_path / "sample"
    sample.mkdir()
    for name, sents in (("train.en", sources[:24]), ("train.fr", targets[:24]),
                        ("trial.en", sources[24:]), ("trial.fr", targets[24:])):
        (sample / name).write_text("".join(" ".join(s) + "\n" for s in sents))
    (sample / "trial.talp").write_text("".join(" ".join(f"{i}-{j}" for i, j in sorted(g)) + "\n"
                                               for g in golds[24:]))
    result = run("demo", "--sample-dir", sample, "--max-epochs", 1, "--bpe-merges", 10,
                 "--workdir", tmp_path / "work", "-q")
    lines = result.stdout.splitlines()
    assert "AER (%) on the 6 trial pairs" in lines[0]
    assert lines[1].split("|")[1].strip() == "method"
    assert [line.split("|")[1].strip() for line in lines[3:5]] == ["hmm-posterior",
                                                                      "hmm-viterbi"]
    assert [c.strip() for c in lines[1].split("|")[2:-1]] == ["fwd", "rev", "grow-diag",
                                                              "intersect", "soft-average"]
    for line in lines[3:5]:
        cells = [float(c) for c in line.split("|")[2:-1]]
        assert len(cells) == 5 and all(0.0 <= c <= 100.0 for c in cells)
    assert (tmp_path / "work" / "model" / "fwd" / C.PARAMS_BEST).is_file()
    assert json.loads((tmp_path / "work" / "model" / C.CONFIG_NAME).read_text())[
        "model_kind"] == "hmm1"
    # the recipe's shape: the teacher's links guide round 1, then its self-training rounds
    rounds = tmp_path / "work" / "model" / C.ROUNDS_DIR
    assert (rounds / "0" / C.ROUND_LINKS).is_file() == recipe.TEACHER
    assert sorted(p.name for p in rounds.iterdir() if p.is_dir()) == [
        str(r) for r in range(0 if recipe.TEACHER else 1, recipe.ROUNDS + 1)]
    missing = run("demo", "--sample-dir", tmp_path, ok=False)
    assert "sample file missing" in error_line(missing)
    # without -q it says how long it will take before it starts
    loud = run("demo", "--sample-dir", sample, "--max-epochs", 1, "--bpe-merges", 10)
    first = loud.stderr.splitlines()[0]
    epochs = " + ".join(["1"] + [str(recipe.FINE_TUNE_EPOCHS)] * (recipe.ROUNDS - 1))
    teacher = "the teacher, then " if recipe.TEACHER else ""
    assert first.startswith(f"align demo: training hmm1 on 30 pairs, {teacher}"
                            f"{recipe.ROUNDS} self-training rounds of {epochs} epochs per "
                            f"direction: about 1 minute(s)")


def test_extract_writes_soft_matrices(tmp_path, corpus):
    import numpy as np

    model = tmp_path / "model"
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model, "--max-updates", 1,
        *TINY)
    soft = tmp_path / "soft.npz"
    # the mean of a word's subwords: each word's distribution sums to 1 (the default max: at
    # least 1, test_subword_pooling_of_the_soft_matrices_and_their_links)
    run("extract", model, "-s", corpus["vsrc"], "-t", corpus["vtgt"], "--soft", soft, "-q",
        "-o", tmp_path / "out.txt", "--subword-pooling", "mean")
    arrays = np.load(soft)
    assert sorted(arrays.files) == sorted(f"{d}_{k}" for d in ("fwd", "rev") for k in range(6))
    for k in range(6):
        shape = (len(corpus["sources"][k]), len(corpus["targets"][k]))
        assert arrays[f"fwd_{k}"].shape == shape and arrays[f"rev_{k}"].shape == shape
        assert np.allclose(arrays[f"fwd_{k}"].sum(axis=0), 1.0, atol=1e-5)  # per target word
        assert np.allclose(arrays[f"rev_{k}"].sum(axis=1), 1.0, atol=1e-5)  # per source word


def test_extract_soft_average_uses_the_soft_matrices(tmp_path, corpus):
    """-H soft-average links exactly where the mean of the --soft matrices exceeds --threshold
    (checked with numpy here, not with the library function), for two thresholds."""
    import numpy as np

    model = tmp_path / "model"
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model, "--max-updates", 6,
        *TINY)
    soft = tmp_path / "soft.npz"
    base = ["extract", model, "-s", corpus["vsrc"], "-t", corpus["vtgt"], "-q"]
    run(*base, "--soft", soft, "-o", tmp_path / "gd.txt")
    arrays = np.load(soft)
    for threshold in (None, 0.3):
        out = tmp_path / f"soft-{threshold}.txt"
        extra = [] if threshold is None else ["--threshold", threshold]
        run(*base, "-H", "soft-average", *extra, "-o", out)
        links = read_pharaoh(str(out))
        assert len(links) == 6
        for k in range(6):
            mean = (arrays[f"fwd_{k}"] + arrays[f"rev_{k}"]) / 2
            expected = {(int(i), int(j)) for i, j in zip(*np.nonzero(mean > (threshold or 0.5)))}
            assert links[k] == expected
    assert read_pharaoh(str(tmp_path / "soft-0.3.txt")) != read_pharaoh(str(tmp_path / "gd.txt"))
    assert "--threshold is the threshold of -H soft-average" in error_line(
        run(*base, "--threshold", 0.4, ok=False))
    assert "--symmetrize combines two directions" in error_line(
        run(*base, "--direction", "rev", "-H", "soft-average", ok=False))


def test_tokenize_and_lowercase_reach_training_and_extraction(tmp_path):
    src, tgt = tmp_path / "raw.en", tmp_path / "raw.fr"
    src.write_text("Hello, world!\nThe cat (black) sleeps.\n" * 10)
    tgt.write_text("Bonjour, le monde !\nLe chat (noir) dort.\n" * 10)
    model = tmp_path / "model"
    run("train", "-s", src, "-t", tgt, "-o", model, "--tokenize", "--lowercase",
        "--src-lang", "en", "--tgt-lang", "fr", "--max-updates", 1, *TINY)
    prep = json.loads((model / "prep.json").read_text())
    assert prep["tokenize"] is True and prep["lowercase"] is True
    vocab = json.loads((model / C.VOCAB_SRC).read_text())["tokens"]
    assert "," in vocab and "Hello," not in vocab and "Hello" not in vocab
    test_src, test_tgt = tmp_path / "t.en", tmp_path / "t.fr"
    test_src.write_text("Hello, world!\n")           # 4 tokens after tokenization
    test_tgt.write_text("Bonjour, le monde !\n")      # 5 tokens
    out = run("extract", model, "-s", test_src, "-t", test_tgt, "--direction", "fwd", "-q")
    links = [tuple(map(int, link.split("-"))) for link in out.stdout.split()]
    # every tokenized target word is linked (its subwords may link to several source words)
    assert {j for _, j in links} == {0, 1, 2, 3, 4}
    assert all(i < 4 for i, _ in links)


def test_train_refuses_a_directory_another_process_writes(tmp_path, corpus):
    import os
    import subprocess
    import sys

    model = tmp_path / "model"
    model.mkdir()
    holder = subprocess.Popen(  # holds the run lock of `model` until killed
        [sys.executable, "-c", "import sys; from aligner.model_dir import acquire_lock; "
                               f"lock = acquire_lock({str(model)!r}); print('locked', "
                               "flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        line = error_line(run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model,
                              "--max-updates", 1, *TINY, ok=False))
    finally:
        holder.kill()
        holder.wait()
    assert f"another training process (pid {holder.pid} on host " in line
    assert os.listdir(model) == [".lock"]  # nothing touched


def test_the_training_length_cap_left_out_is_the_recipes_for_its_kind_only(tmp_path,
                                                                          monkeypatch):
    """--max-len left out: align train's hmm1 (the recipe's kind) skips the training pairs
    longer than recipe.TRAIN_MAX_LEN subwords (set to 8 here, read when the command runs), the
    transformer only those over DataConfig's 200; the cut is 'longer than', so a pair of
    exactly the cap is kept. align run's default is the recipe's, and every line is aligned;
    a --max-len the model cannot take is refused in one line by both commands."""
    from aligner.config import DataConfig
    from aligner.training import recipe

    monkeypatch.setattr(recipe, "TRAIN_MAX_LEN", 8)
    sources, targets, _ = monotone_corpus(12, seed=3)
    for k, length in ((0, 8), (1, 9), (2, DataConfig.max_len + 1)):
        sources[k] = [f"s{n % 9}" for n in range(length)]
        targets[k] = [f"t{n % 9}" for n in range(length)]
    src, tgt, _ = write_corpus(tmp_path, "c", sources, targets)
    tiny = [*TINY, "--bpe-merges", "0", "--max-updates", "1", "--rounds", "1"]
    skipped = {}
    for kind in ("hmm1", "transformer"):
        run("train", "-s", src, "-t", tgt, "-o", tmp_path / kind, *tiny, "--model", kind)
        corpus_meta = json.loads((tmp_path / kind / "corpus" / "corpus.json").read_text())
        skipped[kind] = (corpus_meta["max_len"], corpus_meta["n_too_long"])
    assert skipped == {"hmm1": (8, 2), "transformer": (DataConfig.max_len, 1)}
    line = error_line(run("train", "-s", src, "-t", tgt, "-o", tmp_path / "refused", *tiny,
                          "--max-positions", "20", "--max-len", "20", ok=False))
    assert "--max-len 20: the model takes at most 19 subwords a side" in line
    run_tiny = ["--rounds", "1", "--max-updates", "1", "--bpe-merges", "0", "-M", "d_model=16",
                "-M", "n_heads=2", "-M", "enc_layers=1", "-M", "dec_layers=1", "-M",
                "d_ff=32", "-q"]
    run("run", "-s", src, "-t", tgt, "-o", tmp_path / "out", "--model-dir", tmp_path / "run",
        *run_tiny)
    assert json.loads((tmp_path / "run" / C.CONFIG_NAME).read_text())["data"]["max_len"] == 8
    assert len(read_pharaoh(str(tmp_path / "out"))) == 12     # every line aligned
    line = error_line(run("run", "-s", src, "-t", tgt, "-o", tmp_path / "out2", *run_tiny,
                          "-M", "max_positions=20", "--max-len", "20", ok=False))
    assert "--max-len 20: the model takes at most 19 subwords a side" in line
    assert not (tmp_path / "out2").exists()
