"""`align run`: one command from a bitext to its alignments (aligner/cli/run.py, recipe.py)."""
from __future__ import annotations

import numpy as np
import pytest

from aligner.formats import read_pharaoh
from aligner.training import recipe
from conftest import restored_aligner_logger
from cli_runner import error_line, run
from synthetic import monotone_corpus, write_corpus

TINY = ["--max-updates", "3", "-M", "d_model=16", "-M", "n_heads=2", "-M", "enc_layers=1",
        "-M", "dec_layers=1", "-M", "d_ff=32", "-M", "max_positions=12", "-M",
        "lexicon_sample=0", "--bpe-merges", "0", "--threads", "1", "-q"]


def test_the_recipe_is_pinned():
    """Changing the recipe (what align run trains) must be a deliberate commit."""
    assert recipe.MODEL_KIND == "hmm1"
    assert recipe.MODEL_OPTIONS == dict(d_model=128, n_heads=4, enc_layers=3, dec_layers=3,
                                        d_ff=512, dropout=0.0, max_positions=1024,
                                        tie_embeddings=True, markov_order=0, lexicon_dim=64,
                                        lexicon_sample=0, lexicon_activation="linear")
    assert recipe.TRAINING == dict(lr=3e-3, warmup=150, lr_schedule="inverse-sqrt",
                                   max_tokens=1200, label_smoothing=0.1, clip_norm=1.0)
    # the final alignment's lexicon shortlist; the guides' lexicon is exact
    assert (recipe.SHORTLIST, recipe.GUIDE_SHORTLIST) == (2000, 0)
    assert (recipe.EPOCHS, recipe.METHOD, recipe.HEURISTIC, recipe.THRESHOLD) == \
        (2, "hmm-posterior", "soft-average", 0.55)
    assert (recipe.ROUNDS, recipe.EPOCHS_PER_ROUND, recipe.FINE_TUNE_ROUNDS,
            recipe.SELF_GUIDE_WEIGHT, recipe.FINE_TUNE_EPOCHS,
            recipe.SELF_GUIDE_THRESHOLD, recipe.FINE_TUNE_LR_SCHEDULE) == \
        (2, 1, True, 0.5, 1, 0.5, "linear")
    assert (recipe.TEACHER, recipe.TEACHER_THRESHOLD, recipe.TEACHER_GUIDE_WEIGHT) == \
        (True, 0.5, 1.0)
    assert recipe.AGREEMENT_WEIGHT == recipe.FINAL_AGREEMENT_WEIGHT == 0.0
    assert recipe.ROUND_PAIRS == 40000 and recipe.TRAIN_MAX_LEN == 200
    assert (recipe.ROUND_MIN_PAIRS, recipe.ROUND_MAX_REPEATS) == (25000, 25)
    assert (recipe.CALIBRATION_BETA, recipe.CALIBRATION_LINES, recipe.JOIN_LINES) == (0.7, 300, 1)
    # the teacher's and the network's words are lowercased
    assert recipe.CLASSICAL_LOWERCASE is True and recipe.NETWORK_LOWERCASE is True
    # the guided alignment layer's own stage (stage 2)
    assert (recipe.LAYER_GUIDE_WEIGHT, recipe.LAYER_EPOCHS, recipe.LAYER_LR_SCHEDULE) == \
        (10.0, 8, "linear")
    assert [recipe.bpe_merges(n) for n in (300, 3000, 25237, 60000, 407000)] == \
        [1000, 1000, 5000, 10000, 10000]


@pytest.fixture(scope="module")
def aligned(tmp_path_factory):
    """One align run on 30 synthetic lines with an empty and an over-long line in them."""
    tmp = tmp_path_factory.mktemp("run")
    sources, targets, golds = monotone_corpus(30, seed=5)
    sources[3], targets[7] = [], []
    sources[10] = targets[10] = ["s1"] * 20              # 21 positions > max_positions 12
    src, tgt, _ = write_corpus(tmp, "corpus", sources, targets)
    gold = tmp / "gold.talp"
    gold.write_text("".join(" ".join(f"{i}-{j}" for i, j in sorted(g)) + "\n"
                            for g in golds[-5:]))
    out, fwd, rev, soft = (tmp / name for name in ("out.txt", "fwd.txt", "rev.txt", "soft.npz"))
    with restored_aligner_logger():
        result = run("run", "-s", src, "-t", tgt, "-o", out, "-f", fwd, "-r", rev, "--soft",
                     soft, "--model-dir", tmp / "model", "-g", gold, *TINY)
    return dict(tmp=tmp, src=src, tgt=tgt, out=out, fwd=fwd, rev=rev, soft=soft,
                result=result, sources=sources, targets=targets)


def test_one_line_per_input_line_in_order_with_empty_lines_kept(aligned):
    alignments = read_pharaoh(str(aligned["out"]))
    assert len(alignments) == 30
    for name in ("fwd", "rev"):
        links = read_pharaoh(str(aligned[name]))
        assert len(links) == 30
        for k in (3, 7, 10):                              # empty side, too long
            assert links[k] == set()
        for k, pair in enumerate(links):                  # links index the line's own words
            assert all(i < len(aligned["sources"][k]) and j < len(aligned["targets"][k])
                       for i, j in pair)
        assert sum(map(len, links)) > 0
    assert alignments[3] == alignments[7] == alignments[10] == set()
    assert "align run: 30 sentence pairs" in aligned["result"].stderr
    assert "AER (%) on input lines 26-30" in aligned["result"].stderr
    assert "| soft-average |" in aligned["result"].stderr


def test_aligning_in_blocks_gives_the_same_files_and_table(aligned, monkeypatch):
    """Without --soft the bitext is read from its files and aligned in blocks (7 lines here,
    BLOCK_LINES patched; every round): the same -o/-f/-r files and AER table as the fixture's
    run, which held everything in memory for --soft."""
    import aligner.extract.inference

    monkeypatch.setattr(aligner.extract.inference, "BLOCK_LINES", 7)
    tmp = aligned["tmp"]
    out, fwd, rev = (tmp / name for name in ("b.out", "b.fwd", "b.rev"))
    with restored_aligner_logger():
        result = run("run", "-s", aligned["src"], "-t", aligned["tgt"], "-o", out, "-f", fwd,
                     "-r", rev, "--model-dir", tmp / "model-blocks", "-g", tmp / "gold.talp",
                     *TINY)
    for mine, theirs in ((out, aligned["out"]), (fwd, aligned["fwd"]), (rev, aligned["rev"])):
        assert mine.read_text() == theirs.read_text()
    guide = (tmp / "model-blocks" / "rounds" / "1" / "links.align").read_text()
    assert guide == (tmp / "model" / "rounds" / "1" / "links.align").read_text()
    table = [line for line in result.stderr.splitlines() if line.startswith("|")]
    assert len(table) == 5 and table == [line for line in aligned["result"].stderr.splitlines()
                                         if line.startswith("|")]


def test_outputs_agree_with_align_extract_on_the_kept_model(aligned):
    tmp, model = aligned["tmp"], aligned["tmp"] / "model"
    common = ["-s", aligned["src"], "-t", aligned["tgt"], "-m", "hmm-posterior", "-q"]
    run("extract", model, *common, "--direction", "fwd", "-o", tmp / "x.fwd")
    run("extract", model, *common, "--direction", "rev", "-o", tmp / "x.rev")
    run("extract", model, *common, "-H", "soft-average", "-o", tmp / "x.avg",
        "--soft", tmp / "x.npz")
    assert (tmp / "x.fwd").read_text() == aligned["fwd"].read_text()
    assert (tmp / "x.rev").read_text() == aligned["rev"].read_text()
    assert (tmp / "x.avg").read_text() == aligned["out"].read_text()
    import json                                      # the default run's output threshold
    settings = json.loads((model / "config.json").read_text())["extra"]["align_run"]
    lengths = [max(len(s.split()), len(t.split())) for s, t in
               zip(open(aligned["src"], encoding="utf-8"), open(aligned["tgt"], encoding="utf-8"))
               if s.split() and t.split()]
    long_line = int(np.ceil(np.quantile(lengths, recipe.MIX_LENGTH_QUANTILE)))
    assert settings == {"symmetrize": recipe.HEURISTIC, "threshold": recipe.THRESHOLD,
                        "mix_weight": recipe.MIX_WEIGHT, "mix_length": long_line}
    ours, theirs = np.load(aligned["soft"]), np.load(tmp / "x.npz")
    assert sorted(ours.files) == sorted(theirs.files) and len(ours.files) == 60
    for name in ours.files:
        assert np.array_equal(ours[name], theirs[name])
    # the output mixes the teacher's posteriors (rounds/0, a classical model) into the model's
    run("extract", model, *common, "--mix-weight", "0", "-o", tmp / "own.avg",
        "--soft", tmp / "own.npz")
    run("extract", model / "rounds" / "0", "-s", aligned["src"], "-t", aligned["tgt"], "-q",
        "-o", tmp / "teacher.avg", "--soft", tmp / "teacher.npz")
    own, teacher = np.load(tmp / "own.npz"), np.load(tmp / "teacher.npz")
    mixed = 0
    for name in ours.files:
        if own[name].size == 0:   # an empty side, or too long for the model: no links
            assert ours[name].size == 0
            continue
        words = max(own[name].shape)   # over the bitext's 99th percentile: more teacher
        # (none of the bitext's own lines here; tests/test_mixture.py aligns longer ones)
        w = recipe.MIX_WEIGHT + (1 - recipe.MIX_WEIGHT) * min(1, max(0, words - long_line)
                                                                / long_line)
        np.testing.assert_allclose(ours[name], (1 - w) * own[name] + w * teacher[name],
                                   atol=1e-6)
        mixed += 1
    assert mixed >= 40


def test_bad_input_is_one_error_line(tmp_path):
    sources, targets, _ = monotone_corpus(5, seed=1)
    src, tgt, _ = write_corpus(tmp_path, "c", sources, targets[:4])
    result = run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o", *TINY, ok=False)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].startswith("align: error: ")
    assert "c.src" in result.output and "c.tgt" in result.output
    src, tgt, _ = write_corpus(tmp_path, "d", sources, targets)
    gold = tmp_path / "g.talp"
    gold.write_text("0-0\n" * 6)
    result = run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o", "-g", gold, *TINY, ok=False)
    assert result.exit_code == 1
    assert "g.talp: 6 lines do not fit the 5 input lines" in result.output
    assert not (tmp_path / "o").exists()


def test_a_refused_setting_leaves_no_temporary_model_directory(tmp_path, monkeypatch):
    """Without --model-dir the model lives in a temporary directory: a setting refused in
    one line (--lr 0, refused by the training settings; an unknown device) leaves none."""
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    sources, targets, _ = monotone_corpus(5, seed=1)
    src, tgt, _ = write_corpus(tmp_path, "c", sources, targets)
    for option, value, message in (("--lr", "0", "--lr must be positive"),
                                   ("--device", "tpu", "tpu")):
        line = error_line(run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o", *TINY,
                              option, value, ok=False))
        assert message in line, line
        assert list(scratch.iterdir()) == [], option
    assert not (tmp_path / "o").exists()


def test_run_passes_a_guide_to_training(tmp_path):
    sources, targets, golds = monotone_corpus(12, seed=3)
    src, tgt, gold = write_corpus(tmp_path, "c", sources, targets, golds)
    run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o", "--guide", gold, "--guide-weight",
        "0.5", "--model-dir", tmp_path / "m", "--rounds", "1", *TINY)   # round 2 has its own
    import json
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["data"]["guide"] == str(gold) and config["training"]["guide_weight"] == 0.5
    assert (tmp_path / "m" / "corpus" / "guide.links.npy").exists()
    bad = tmp_path / "bad.talp"
    bad.write_text("0-0\n")
    result = run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o2", "--guide", bad, *TINY,
                 ok=False)
    assert result.exit_code == 1 and "bad.talp: 1 lines, but the training bitext has 12" \
        in result.output


def test_run_trains_with_agreement(tmp_path):
    sources, targets, golds = monotone_corpus(12, seed=3)
    src, tgt, _ = write_corpus(tmp_path, "c", sources, targets, golds)
    with restored_aligner_logger():
        run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o", "--agreement-weight", "2",
            "--model-dir", tmp_path / "m", *TINY)
    import json
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["training"]["agreement_weight"] == 2.0
    last = max(int(p.name) for p in (tmp_path / "m" / "rounds").iterdir() if p.name.isdigit())
    assert (tmp_path / "m" / "rounds" / str(last) / "joint" / "training_state.pt").is_file()
    assert len((tmp_path / "o").read_text().splitlines()) == 12


def test_rounds_train_again_guided_by_the_previous_rounds_alignments(tmp_path):
    sources, targets, golds = monotone_corpus(12, seed=4)
    sources[5] = []                                     # an empty line: an empty guide line
    src, tgt, _ = write_corpus(tmp_path, "c", sources, targets, golds)
    model = tmp_path / "m"
    with restored_aligner_logger():
        result = run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o", "--rounds", "2",
                     "--self-guide-weight", "0.25", "--model-dir", model, *TINY)
    assert "(2 self-training rounds)" in result.output
    guide = model / "rounds" / "1" / "links.align"
    round1 = read_pharaoh(str(guide))
    assert len(round1) == 12 and round1[5] == set() and sum(map(len, round1)) > 0
    import json
    config = json.loads((model / "config.json").read_text())
    assert config["data"]["guide"] == str(guide) and config["training"]["guide_weight"] == 0.25
    assert (model / "rounds" / "2" / "corpus" / "guide.links.npy").exists()
    # round 2 fine-tuned round 1's model (align train --init-from, tests/test_init_from.py),
    # each in its own directory; the top level is round 2's, with its log
    assert config["extra"]["init_from"] == str((model / "rounds" / "1").resolve())
    assert "weights of" in (model / "rounds" / "2" / "train.log").read_text()
    round1_log = (model / "rounds" / "1" / "train.log").read_text()
    assert "command: align" in round1_log and "weights of" not in round1_log
    assert "done:" in round1_log
    # the output is the round-2 model's: what align extract gives with the kept model
    run("extract", model, "-s", src, "-t", tgt, "-o", tmp_path / "x", "-q")
    assert (tmp_path / "o").read_text() == (tmp_path / "x").read_text()


def test_the_recipe_aligns_a_cased_bitext_as_its_lowercased_copy(tmp_path):
    """align run (teacher and rounds) lowercases the network's words as the teacher's: a
    bitext and its copy with words in capitals give the same links, indexing the input's
    words; --no-lowercase keeps the capitals as other words."""
    import json
    sources, targets, _ = monotone_corpus(12, seed=4)
    cased = [[w.upper() if k % 2 == 0 else w for k, w in enumerate(line)] for line in sources]
    assert cased != sources
    outputs = {}
    for name, side, flags in (("lower", sources, ()), ("cased", cased, ()),
                              ("kept", cased, ("--no-lowercase",))):
        src, tgt, _ = write_corpus(tmp_path, name, side, targets)
        with restored_aligner_logger():
            run("run", "-s", src, "-t", tgt, "-o", tmp_path / f"{name}.align", "--model-dir",
                tmp_path / name, "--rounds", "2", "--seed", "3", *flags, *TINY)
        outputs[name] = (tmp_path / f"{name}.align").read_text()
        for model in (tmp_path / name, tmp_path / name / "rounds" / "1"):
            prep = json.loads((model / "prep.json").read_text())
            assert prep["lowercase"] is (not flags)
    assert outputs["cased"] == outputs["lower"]
    assert len(outputs["lower"].splitlines()) == 12 and outputs["lower"].strip()

    def tokens(name):
        return json.loads((tmp_path / name / "vocab.src.json").read_text())["tokens"]

    assert not any(w.isupper() for w in tokens("cased"))
    assert any(w.isupper() for w in tokens("kept"))


def test_rounds_afresh_train_from_new_weights(tmp_path):
    sources, targets, golds = monotone_corpus(12, seed=4)
    src, tgt, _ = write_corpus(tmp_path, "c", sources, targets, golds)
    model = tmp_path / "m"
    with restored_aligner_logger():
        run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o", "--rounds", "2", "--afresh",
            "--model-dir", model, *TINY)
    import json
    config = json.loads((model / "config.json").read_text())
    assert config["data"]["guide"] == str(model / "rounds" / "1" / "links.align")
    assert "init_from" not in config["extra"]
    assert "weights of" not in (model / "rounds" / "2" / "train.log").read_text()
    # a round from new weights keeps round 1's schedule (--fine-tune-lr-schedule: fine-tuned)
    assert config["training"]["lr_schedule"] == "inverse-sqrt"
    # a run over the same directory (--overwrite) guided by one of its rounds' links is
    # refused before anything is removed; guided by a copy, the earlier run's rounds go, and
    # so do an older version's round files (one directory rewritten per round); files of the
    # user stay
    (model / "notes.txt").write_text("mine\n")
    links = model / "rounds" / "1" / "links.align"
    line = error_line(run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o", "--rounds", "2",
                          "--guide", links, "--model-dir", model, "--overwrite", *TINY,
                          ok=False))
    assert "an input of this run lies in" in line and "nothing was removed" in line
    assert (model / "rounds" / "2" / "done").exists()
    (tmp_path / "g.align").write_text(links.read_text())
    (model / "previous_round").mkdir()
    (model / "selftrain.round2.align").write_text("")
    (model / "selftrain.json").write_text("{}")
    with restored_aligner_logger():
        run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o", "--rounds", "2",
            "--guide", tmp_path / "g.align", "--model-dir", model, "--overwrite", *TINY)
    assert not [p.name for p in model.iterdir() if p.name.startswith(("selftrain", "previous"))]
    assert sorted(p.name for p in (model / "rounds").iterdir()) == ["1", "2", "settings.json"]
    assert (model / "notes.txt").read_text() == "mine\n"


def test_gold_table_without_f_r_aligns_hard_links_of_the_gold_lines_only(aligned, tmp_path,
                                                                         monkeypatch):
    """Without -f/-r the fwd/rev rows of the AER table come from the gold lines alone: the
    same table as a run that aligned every line."""
    import aligner.extract.inference

    hard_pairs = []
    align_pairs = aligner.extract.inference.align_pairs

    def counted(model, pairs, *args, **kwargs):
        hard_pairs.append(len(pairs))
        return align_pairs(model, pairs, *args, **kwargs)

    monkeypatch.setattr(aligner.extract.inference, "align_pairs", counted)
    gold = aligned["tmp"] / "gold.talp"
    result = run("run", "-s", aligned["src"], "-t", aligned["tgt"], "-o", tmp_path / "o",
                 "-g", gold, *[a for a in TINY if a != "-q"])
    table = [line for line in result.stderr.splitlines() if line.startswith("| ")]
    expected = [line for line in aligned["result"].stderr.splitlines() if line.startswith("| ")]
    assert len(table) == 4 and table == expected
    assert (tmp_path / "o").read_text() == aligned["out"].read_text()
    assert hard_pairs == [5, 5]           # the hard-link pass: the 5 gold lines, per direction
    # one progress bar over the corpus (30 lines), none per direction and pass
    bars = result.stderr.replace("\r", "\n")
    assert "30/30" in bars and "5/5" not in bars and "27/27" not in bars


def test_fine_tuned_rounds_train_fine_tune_epochs(tmp_path):
    """Round 1 trains --epochs, a fine-tuned round --fine-tune-epochs (no --max-updates), each
    repeated recipe.round_epoch_repeats times on this 12-line bitext."""
    sources, targets, golds = monotone_corpus(12, seed=4)
    src, tgt, _ = write_corpus(tmp_path, "c", sources, targets, golds)
    model = tmp_path / "m"
    assert TINY[:2] == ["--max-updates", "3"]
    with restored_aligner_logger():
        run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o", "--rounds", "2", "--epochs", "1",
            "--fine-tune-epochs", "3", "--model-dir", model, *TINY[2:])
    import json
    config = json.loads((model / "config.json").read_text())
    repeats = recipe.round_epoch_repeats(12)
    assert config["training"]["max_epochs"] == 3 * repeats
    assert config["training"]["max_updates"] == 0
    header, *rows = (model / "rounds" / "2" / "fwd" / "metrics.tsv").read_text().splitlines()
    assert int(dict(zip(header.split("\t"), rows[-1].split("\t")))["epoch"]) == 3 * repeats
    # a fine-tuned round decays linearly (recipe.FINE_TUNE_LR_SCHEDULE); round 1 did not
    assert config["training"]["lr_schedule"] == "linear"
    with restored_aligner_logger():
        run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o", "--rounds", "1", "--epochs", "1",
            "--model-dir", model, "--overwrite", *TINY[2:])
    config = json.loads((model / "config.json").read_text())
    assert config["training"]["lr_schedule"] == "inverse-sqrt"


def test_guides_use_the_self_guide_threshold_and_extract_defaults_to_the_runs_threshold(
        tmp_path):
    """Round 1's guide is soft-average at --self-guide-threshold of round 1's matrices (round 1
    of a 2-round run is the 1-round run with the same seed); the output is at --threshold,
    which the model directory records for align extract (no flags: the same links)."""
    from aligner.links.soft_symmetrize import soft_average

    sources, targets, golds = monotone_corpus(12, seed=4)
    src, tgt, _ = write_corpus(tmp_path, "c", sources, targets, golds)
    with restored_aligner_logger():
        run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o1", "--rounds", "1", "--soft",
            tmp_path / "r1.npz", "--model-dir", tmp_path / "m1", *TINY)
        run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o2", "--rounds", "2",
            "--self-guide-threshold", "0.3", "--threshold", "0.7", "--model-dir",
            tmp_path / "m2", *TINY)
    matrices = np.load(tmp_path / "r1.npz")
    expected = [soft_average(matrices[f"fwd_{k}"], matrices[f"rev_{k}"], 0.3)
                for k in range(12)]
    guide = read_pharaoh(str(tmp_path / "m2" / "rounds" / "1" / "links.align"))
    assert guide == expected
    assert guide != [soft_average(matrices[f"fwd_{k}"], matrices[f"rev_{k}"], 0.7)
                     for k in range(12)]
    import json
    config = json.loads((tmp_path / "m2" / "config.json").read_text())
    recorded = config["extra"]["align_run"]
    assert recorded == {"symmetrize": "soft-average", "threshold": 0.7,
                        "mix_weight": recipe.MIX_WEIGHT,
                        "mix_length": recorded["mix_length"]} and recorded["mix_length"] > 0
    config = json.loads((tmp_path / "m1" / "config.json").read_text())   # --rounds 1: 0.5
    assert config["extra"]["align_run"] == {"symmetrize": "soft-average", "threshold": 0.5}
    from aligner.api import Aligner                  # the Python API: the same defaults
    aligner = Aligner.load(str(tmp_path / "m2"))
    assert aligner.align(sources, targets) == read_pharaoh(str(tmp_path / "o2"))
    run("extract", tmp_path / "m2", "-s", src, "-t", tgt, "-o", tmp_path / "own", "-q",
        "--mix-weight", "0")                       # the network alone, as the API gives it
    assert aligner.align(sources, targets, mix_weight=0) == read_pharaoh(str(tmp_path / "own"))
    run("extract", tmp_path / "m2", "-s", src, "-t", tgt, "-o", tmp_path / "x", "-q")
    assert (tmp_path / "x").read_text() == (tmp_path / "o2").read_text()
    run("extract", tmp_path / "m2", "-s", src, "-t", tgt, "-o", tmp_path / "x5",
        "-H", "soft-average", "--threshold", "0.5", "-q")
    assert (tmp_path / "x5").read_text() != (tmp_path / "o2").read_text()


def test_resume_with_another_threshold_is_refused_and_the_recorded_one_kept(aligned,
                                                                          tmp_path):
    """--resume --threshold 0.3 on a finished run wrote links at 0.3 while config.json kept
    0.55, so align extract gave other links than the run: it is refused (one line, nothing
    written), and the same command with the run's threshold goes on as before."""
    import json

    from aligner import constants as C

    model = aligned["tmp"] / "model"
    final = json.loads((model / C.CONFIG_NAME).read_text())["extra"][C.ALIGN_RUN_SETTINGS]
    assert final["threshold"] == recipe.THRESHOLD
    common = ["run", "-s", aligned["src"], "-t", aligned["tgt"], "--model-dir", model,
              "--resume", *TINY]
    line = error_line(run(*common, "-o", tmp_path / "o", "--threshold", "0.3", ok=False))
    assert f"--threshold ({recipe.THRESHOLD!r} saved, 0.3 asked)" in line
    assert not (tmp_path / "o").exists()
    assert json.loads((model / C.CONFIG_NAME).read_text())["extra"][
        C.ALIGN_RUN_SETTINGS] == final
    with restored_aligner_logger():
        run(*common, "-o", tmp_path / "same")
    assert (tmp_path / "same").read_bytes() == aligned["out"].read_bytes()
