"""`align train --rounds`: self-training rounds (aligner/training/rounds.py), as `align run`
trains them, and --resume of a run cut off between or inside rounds."""
from __future__ import annotations

import json
import os
import sys

import pytest

from aligner import faults
from aligner.formats import read_pharaoh
from aligner.training import recipe
from aligner.training.rounds import default_rounds
from aligner.training.run_record import RunRecord
from cli_runner import error_line, run
from conftest import ROOT, cut_off_at_checkpoint, restored_aligner_logger
from synthetic import monotone_corpus, write_corpus

#: a tiny hmm1 with align run's data limit (max_len = max_positions - 1); --max-epochs 0: the
#: updates decide, as align run's --max-updates does
TRAIN_TINY = ["--d-model", "16", "--heads", "2", "--encoder-layers", "1", "--decoder-layers",
              "1", "--ff-dim", "32", "--max-positions", "12", "--max-len", "11",
              "--bpe-merges", "0", "--threads", "1", "--max-epochs", "0", "-q"]
RUN_TINY = ["-M", "d_model=16", "-M", "n_heads=2", "-M", "enc_layers=1", "-M", "dec_layers=1",
            "-M", "d_ff=32", "-M", "max_positions=12", "--bpe-merges", "0", "--threads", "1",
            "-q"]


@pytest.fixture
def corpus(tmp_path):
    sources, targets, golds = monotone_corpus(12, seed=4)
    sources[5] = []                                 # an empty line: an empty guide line
    src, tgt, _ = write_corpus(tmp_path, "c", sources, targets, golds)
    return src, tgt


def _done_rounds(model) -> list:
    """The rounds of MODEL_DIR/rounds/ whose done mark is written."""
    return sorted(int(p.parent.name) for p in model.glob("rounds/*/done"))


def _links(model, round_number):
    """MODEL_DIR/rounds/N/links.align: round N's links, round N+1's guide."""
    return model / "rounds" / str(round_number) / "links.align"


def _config(model_dir):
    return json.loads((model_dir / "config.json").read_text())


def test_train_rounds_give_what_align_run_gives(tmp_path, corpus):
    """align train --rounds 3 + align extract (no flags) = align run --rounds 3: the same
    guides between the rounds, the same output; the directory records the last round and the
    output's threshold for align extract."""
    src, tgt = corpus
    model, kept = tmp_path / "m", tmp_path / "r"
    with restored_aligner_logger():
        result = run("train", "-s", src, "-t", tgt, "-o", model, "--rounds", "3",
                     "--max-updates", "3", *TRAIN_TINY[:-1])
        run("run", "-s", src, "-t", tgt, "-o", tmp_path / "o", "--rounds", "3",
            "--max-updates", "3", "--model-dir", kept, *RUN_TINY)
    assert "(round 3 of 3)" in result.output
    for round_number in (1, 2):
        assert _links(model, round_number).read_text() == _links(kept, round_number).read_text()
        assert len(read_pharaoh(str(_links(model, round_number)))) == 12
        assert (model / "rounds" / str(round_number) / "train.log").exists()
    assert not _links(model, 3).exists()
    assert _done_rounds(model) == [1, 2, 3]
    # the top level is round 3's model: its config and weights
    assert (model / "config.json").read_bytes() == \
        (model / "rounds" / "3" / "config.json").read_bytes()
    for direction in ("fwd", "rev"):
        assert (model / direction / "params.best.pt").read_bytes() == \
            (model / "rounds" / "3" / direction / "params.best.pt").read_bytes()
    config = _config(model)
    assert config["extra"]["self_training"] == {"round": 3}
    from aligner.extract.mixture import long_line_length
    from aligner.formats import read_bitext
    assert config["extra"]["align_run"] == {   # the mixture's long lines: the bitext's 99th %
        "symmetrize": recipe.HEURISTIC, "threshold": recipe.THRESHOLD,
        "mix_weight": recipe.MIX_WEIGHT,
        "mix_length": long_line_length(read_bitext(str(src), str(tgt)),
                                       recipe.MIX_LENGTH_QUANTILE)}
    # round 0 is the teacher, a classical model directory, mixed into the output
    assert _config(model / "rounds" / "0")["model_kind"] == "classical"
    assert config["data"]["guide"] == str(_links(model, 2))
    assert config["training"]["guide_weight"] == recipe.SELF_GUIDE_WEIGHT
    assert config["training"]["lr_schedule"] == recipe.FINE_TUNE_LR_SCHEDULE
    assert config["extra"]["init_from"] == os.path.abspath(model / "rounds" / "2")
    run("extract", model, "-s", src, "-t", tgt, "-o", tmp_path / "x", "-q")
    assert (tmp_path / "x").read_text() == (tmp_path / "o").read_text()
    # eval/compare_aligners.py counts every round's training, from the real run record
    sys.path.insert(0, str(ROOT / "eval"))
    import compare_aligners

    record = compare_aligners.recorded_training(str(model))   # (tiny: seconds may be 0.0)
    assert set(record.seconds) == {"preparation", "teacher", "training", "guides"}
    assert record.total == pytest.approx(RunRecord.load(str(model)).wall_seconds())
    (note,) = record.notes
    assert "the classical teacher" in note and "over self-training rounds 1-3" in note


def test_self_training_options_reach_the_rounds(tmp_path, corpus):
    src, tgt = corpus
    model = tmp_path / "m"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", model, "--rounds", "2", "--max-updates", "2",
            "--self-guide-weight", "0.25", "--afresh", "--self-guide-threshold", "0.3",
            *TRAIN_TINY)
    config = _config(model)
    assert config["training"]["guide_weight"] == 0.25
    assert "init_from" not in config["extra"]          # --afresh: new weights
    assert config["training"]["lr_schedule"] == recipe.TRAINING["lr_schedule"]
    # without --max-updates a fine-tuned round trains --fine-tune-epochs
    other = tmp_path / "e"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", other, "--rounds", "2",
            "--fine-tune-epochs", "3", "--fine-tune-lr-schedule", "inverse-sqrt",
            *TRAIN_TINY[:-5], "--max-epochs", "1", "-q")
    config = _config(other)
    # (each epoch repeated recipe.round_epoch_repeats times on this 12-line bitext)
    assert (config["training"]["max_epochs"], config["training"]["max_updates"]) == \
        (3 * recipe.round_epoch_repeats(12), 0)
    assert config["training"]["lr_schedule"] == "inverse-sqrt"


def test_round_1_is_guided_by_the_teachers_links_of_its_lines(tmp_path, corpus):
    """With rounds (and no --guide) round 1 trains guided by MODEL_DIR/rounds/0/links.align:
    the classical teacher's soft-average links of round 1's lines (aligner/training/teacher.py), one
    line per line, at recipe.TEACHER_GUIDE_WEIGHT; --no-teacher trains round 1 unguided; a
    user's --guide replaces the teacher."""
    from aligner.formats import format_links
    from aligner.links.combine import combine
    from aligner.training.teacher import soft_alignments

    src, tgt = corpus
    model = tmp_path / "m"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", model, "--rounds", "2", "--max-updates", "2",
            *TRAIN_TINY)
    round1 = _config(model / "rounds" / "1")
    assert round1["data"]["guide"] == str(_links(model, 0))
    assert round1["training"]["guide_weight"] == recipe.TEACHER_GUIDE_WEIGHT
    sources = [line.split() for line in open(src, encoding="utf-8").read().splitlines()]
    targets = [line.split() for line in open(tgt, encoding="utf-8").read().splitlines()]
    expected = combine("soft-average", recipe.TEACHER_THRESHOLD,
                       soft=soft_alignments(sources, targets))
    assert _links(model, 0).read_text() == "".join(format_links(links) + "\n"
                                                    for links in expected)
    assert _links(model, 0).read_text().splitlines()[5] == ""    # the empty line
    stages = [s["stage"] for s in RunRecord.load(str(model)).stages]
    assert stages[0] == "teacher"

    unguided = tmp_path / "u"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", unguided, "--rounds", "2", "--max-updates",
            "2", "--no-teacher", *TRAIN_TINY)
    assert not (unguided / "rounds" / "0").exists()
    round1 = _config(unguided / "rounds" / "1")
    assert not round1["data"]["guide"] and round1["training"]["guide_weight"] == 0
    # resuming with the other choice is refused: round 1's guide would differ
    assert "--teacher/--no-teacher" in error_line(run(
        "train", "-s", src, "-t", tgt, "-o", unguided, "--rounds", "2", "--max-updates", "2",
        "--resume", *TRAIN_TINY, ok=False))

    guided = tmp_path / "g"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", guided, "--rounds", "2", "--max-updates",
            "2", "--guide", _links(model, 0), *TRAIN_TINY)
    assert not (guided / "rounds" / "0").exists()
    assert _config(guided / "rounds" / "1")["data"]["guide"] == str(_links(model, 0))


def test_self_guide_mix_weight_guides_a_round_by_the_teachers_mixture(tmp_path, corpus):
    """--self-guide-mix-weight W: the links that guide round 2 are round 1's posteriors mixed
    with the teacher's (rounds/0) at W, as `align extract rounds/1 --mix rounds/0` writes them
    at the guide's threshold, exact lexicon and subword pooling; 0 (the default) is round 1's
    alone; a run is not resumed with another W."""
    from aligner.extract.mixture import long_line_length
    from aligner.formats import read_bitext

    src, tgt = corpus
    args = ["--rounds", "2", "--max-updates", "2", *TRAIN_TINY]
    mixed, alone = tmp_path / "m", tmp_path / "a"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", mixed, "--self-guide-mix-weight", "0.5", *args)
        run("train", "-s", src, "-t", tgt, "-o", alone, *args)
    settings = json.loads((mixed / "rounds" / "settings.json").read_text())["settings"]
    assert settings["--self-guide-mix-weight"] == 0.5
    length = long_line_length(read_bitext(str(src), str(tgt)), recipe.MIX_LENGTH_QUANTILE)
    extract = ["-s", src, "-t", tgt, "--threshold", str(recipe.SELF_GUIDE_THRESHOLD),
               "-O", "shortlist=0", "--uncalibrated", "--subword-pooling",
               recipe.GUIDE_SUBWORD_POOLING, "-q"]
    with restored_aligner_logger():
        run("extract", mixed / "rounds" / "1", "-o", tmp_path / "x", "--mix",
            mixed / "rounds" / "0", "--mix-weight", "0.5", "--mix-length", str(length),
            "--mix-threshold", str(recipe.TEACHER_MIX_THRESHOLD), *extract)
        run("extract", mixed / "rounds" / "1", "-o", tmp_path / "y", *extract)
        run("extract", alone / "rounds" / "1", "-o", tmp_path / "z", *extract)
    guide = _links(mixed, 1).read_text()
    assert guide == (tmp_path / "x").read_text()
    assert guide != (tmp_path / "y").read_text()     # the teacher's share changed links
    assert _links(alone, 1).read_text() == (tmp_path / "z").read_text()
    line = error_line(run("train", "-s", src, "-t", tgt, "-o", mixed, "--rounds", "3",
                          "--max-updates", "2", "--resume", *TRAIN_TINY, ok=False))
    assert "--self-guide-mix-weight (0.5 saved, 0.0 asked)" in line


def test_final_agreement_weight_trains_the_last_round_together(tmp_path, corpus):
    """--final-agreement-weight: rounds 1..N-1 train each direction on its own, round N both
    together with the agreement term (its joint/ state, config), fine-tuning round N-1 and
    guided by it; the setting is part of the plan a resume must keep."""
    src, tgt = corpus
    model = tmp_path / "m"
    args = ["train", "-s", src, "-t", tgt, "-o", model, "--rounds", "3", "--max-updates", "2",
            *TRAIN_TINY]
    with restored_aligner_logger():
        run(*args, "--final-agreement-weight", "0.5")
    rounds = model / "rounds"
    for number in (1, 2):
        assert _config(rounds / str(number))["training"]["agreement_weight"] == 0.0
        assert not (rounds / str(number) / "joint").exists()
    last = _config(rounds / "3")
    assert last["training"]["agreement_weight"] == 0.5
    assert last["training"]["guide_weight"] == recipe.SELF_GUIDE_WEIGHT
    assert last["extra"]["init_from"] == os.path.abspath(rounds / "2")
    assert (rounds / "3" / "joint").is_dir()
    assert "agreement weight 0.5" in (rounds / "3" / "train.log").read_text()
    assert _config(model)["training"]["agreement_weight"] == 0.5   # round 3 published
    with restored_aligner_logger():
        line = error_line(run(*args, "--final-agreement-weight", "1", "--resume", ok=False))
        assert "--final-agreement-weight (0.5 saved, 1.0 asked)" in line
        # no round can follow the agreement round
        line = error_line(run(*args[:-len(TRAIN_TINY)], *TRAIN_TINY, "--rounds", "4",
                              "--final-agreement-weight", "0.5", "--resume", ok=False))
        assert "its last round (3) trains with --final-agreement-weight" in line
        # one round has no last round to fine-tune; the agreement round is one process
        for extra in (["--rounds", "1"], ["--parallel-directions"]):
            line = error_line(run("train", "-s", src, "-t", tgt, "-o", tmp_path / "x",
                                  "--max-updates", "2", *TRAIN_TINY,
                                  "--final-agreement-weight", "0.5", "--rounds", "3",
                                  *extra, ok=False))
            assert "--final-agreement-weight" in line, extra


def test_the_recipes_final_agreement_weight_applies_to_runs_of_two_rounds_or_more(monkeypatch):
    """Not given, --final-agreement-weight is the recipe's for a run of rounds and 0 for one
    plain training (which then trains as before); given, it is taken as is (and a run of one
    round refuses it)."""
    from aligner.training.builder import resolve_final_agreement_weight as resolve

    monkeypatch.setattr(recipe, "FINAL_AGREEMENT_WEIGHT", 3.0)
    assert (resolve(None, 4), resolve(None, 2), resolve(None, 1)) == (3.0, 3.0, 0.0)
    assert (resolve(0.0, 4), resolve(1.5, 4), resolve(1.5, 1)) == (0.0, 1.5, 1.5)


def test_a_final_agreement_round_cut_off_resumes_to_the_same_weights(tmp_path, corpus):
    """Cut off after the agreement round's first checkpoint (round 1 writes 4: 2 per
    direction), --resume goes on from it and ends with an uninterrupted run's weights."""
    src, tgt = corpus
    args = ["--rounds", "2", "--max-updates", "4", "--checkpoint-interval", "2",
            "--final-agreement-weight", "3", *TRAIN_TINY]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", whole, *args)
        with faults.injected("checkpoint", 5):
            error_line(run("train", "-s", src, "-t", tgt, "-o", cut, *args, ok=False))
        assert _done_rounds(cut) == [1]
        run("train", "-s", src, "-t", tgt, "-o", cut, *args, "--resume")
    assert "resumed at update 2" in (cut / "rounds" / "2" / "train.log").read_text()
    for direction in ("fwd", "rev"):
        assert (cut / direction / "params.best.pt").read_bytes() == \
            (whole / direction / "params.best.pt").read_bytes()


def test_no_rounds_flag_trains_the_recipes_rounds_for_the_hmms_only(tmp_path, corpus,
                                                                     monkeypatch):
    assert default_rounds("hmm1", ("fwd", "rev")) == recipe.ROUNDS > 1
    assert default_rounds("hmm0", ("fwd", "rev")) == recipe.ROUNDS
    assert default_rounds("transformer", ("fwd", "rev")) == 1
    assert default_rounds("alignment-layer", ("fwd", "rev")) == 1
    assert default_rounds("hmm1", ("fwd",)) == 1
    assert default_rounds("hmm1", ("rev", "fwd")) == recipe.ROUNDS   # the order is the user's
    monkeypatch.setenv("WORLD_SIZE", "2")              # torchrun: the same recipe
    assert default_rounds("hmm1", ("fwd", "rev")) == recipe.ROUNDS
    monkeypatch.delenv("WORLD_SIZE")
    src, tgt = corpus
    model = tmp_path / "m"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", model, "--max-updates", "1", *TRAIN_TINY)
    assert _config(model)["extra"]["self_training"] == {"round": recipe.ROUNDS}
    # round 0: the teacher's links, round 1's guide (recipe.TEACHER)
    assert sorted(p.parent.name for p in model.glob("rounds/*/links.align")) == [
        str(r) for r in range(0 if recipe.TEACHER else 1, recipe.ROUNDS)]
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", tmp_path / "one", "--rounds", "1",
            "--max-updates", "1", *TRAIN_TINY)
    config = _config(tmp_path / "one")
    assert "self_training" not in config["extra"] and "align_run" not in config["extra"]
    assert not (tmp_path / "one" / "rounds").exists()


@pytest.mark.parametrize("extra, message", [
    (["--model", "transformer"], "implemented for the direct HMMs (hmm0, hmm1), not "
                                 "'transformer'"),
    (["--directions", "fwd"], "both directions' alignments; train --directions fwd,rev"),
])
def test_rounds_that_cannot_self_train_are_refused(tmp_path, corpus, extra, message):
    src, tgt = corpus
    line = error_line(run("train", "-s", src, "-t", tgt, "-o", tmp_path / "m", "--rounds", "2",
                          *extra, *TRAIN_TINY, ok=False))
    assert message in line and "--rounds 2" in line
    assert not (tmp_path / "m").exists()


#: where a 3-round run is cut off (aligner/faults.py: the point and its pass): the first
#: alignment of the bitext (after round 1's training); once round 1's links are written, as
#: round 2 begins; round 2 while it encodes the corpus (round 1's preparation is the first
#: pass); round 2 right after fwd's first checkpoint, rev not started (round 1 writes 4
#: checkpoints, 2 per direction at --max-updates 4 --checkpoint-interval 2)
CUT_OFF_IN_ALIGNMENT = ("guide-alignment", 1)
CUT_OFF_AFTER_THE_LINKS = ("round-start", 1)
CUT_OFF_IN_PREPARATION = ("preparation", 2)
CUT_OFF_IN_TRAINING = ("checkpoint", 5)


@pytest.mark.parametrize("interrupt", [CUT_OFF_IN_ALIGNMENT, CUT_OFF_AFTER_THE_LINKS,
                                       CUT_OFF_IN_PREPARATION, CUT_OFF_IN_TRAINING])
def test_resume_continues_a_cut_off_self_training_run(tmp_path, corpus, interrupt):
    """Cut off (Ctrl-C) between or inside rounds, the same command plus --resume ends with
    the directory an uninterrupted run writes."""
    src, tgt = corpus
    args = ["--rounds", "3", "--max-updates", "4", "--checkpoint-interval", "2", *TRAIN_TINY]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", whole, *args)
        with faults.injected(*interrupt):
            line = error_line(run("train", "-s", src, "-t", tgt, "-o", cut, *args, ok=False))
        assert "interrupted; continue with the same command plus --resume" in line
        if interrupt == CUT_OFF_IN_PREPARATION:
            assert not (cut / "rounds" / "2" / "config.json").exists()
        assert not (cut / "config.json").exists()    # published once the last round is done
        run("train", "-s", src, "-t", tgt, "-o", cut, *args, "--resume")
    round2_log = (cut / "rounds" / "2" / "train.log").read_text()
    if interrupt == CUT_OFF_IN_TRAINING:   # fwd went on from its checkpoint, rev began
        assert "[fwd] resumed at update 2" in round2_log
        assert "[rev] resumed" not in round2_log
    else:
        assert "resumed at update" not in round2_log
    for round_number in (1, 2):
        assert _links(cut, round_number).read_text() == _links(whole, round_number).read_text()
    assert _config(cut)["extra"] == {
        **_config(whole)["extra"], "init_from": os.path.abspath(cut / "rounds" / "2")}
    # the run record keeps every round's training, over both sessions
    record = RunRecord.load(str(cut))
    assert [session["resumed"] for session in record.sessions] == [False, True]
    assert {(stage["round"], stage["direction"]) for stage in record.stages
            if stage["stage"] == "training"} == {(r, d) for r in (1, 2, 3)
                                                  for d in ("fwd", "rev")}
    for model in (whole, cut):
        run("extract", model, "-s", src, "-t", tgt, "-o", tmp_path / f"{model.name}.x",
            "--soft", tmp_path / f"{model.name}.npz", "-q")
    assert (tmp_path / "cut.x").read_text() == (tmp_path / "whole.x").read_text()
    import numpy as np
    whole_soft, cut_soft = np.load(tmp_path / "whole.npz"), np.load(tmp_path / "cut.npz")
    assert sorted(whole_soft.files) == sorted(cut_soft.files)
    for name in whole_soft.files:
        np.testing.assert_allclose(cut_soft[name], whole_soft[name], rtol=1e-5, atol=1e-6)
    # resumed once more, the finished run has nothing left to train: not even a log line
    log_path = cut / "rounds" / "3" / "train.log"
    weights, log = (cut / "fwd" / "params.best.pt").read_bytes(), log_path.read_text()
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", cut, *args, "--resume")
    assert (cut / "fwd" / "params.best.pt").read_bytes() == weights
    assert log_path.read_text() == log
    # more rounds than the directory's run has: refused, as a changed setting is
    line = error_line(run("train", "-s", src, "-t", tgt, "-o", cut, *args[2:], "--rounds", "2",
                          "--resume", ok=False))
    assert "holds round 3 of a self-training run; --rounds 2 ends before it" in line


def test_run_record_of_a_two_round_run_adds_up_and_a_resumed_run_appends(tmp_path, corpus):
    """MODEL_DIR/run.json of a 2-round run cut off in round 2's training, then resumed: the
    first session's stages (round 1 and round 2's preparation), the resumed session's (round
    2's directions), their seconds within the commands' wall time."""
    import time

    src, tgt = corpus
    args = ["--rounds", "2", "--max-updates", "4", "--checkpoint-interval", "2", *TRAIN_TINY]
    model = tmp_path / "m"
    start = time.time()
    with restored_aligner_logger():
        with faults.injected(*CUT_OFF_IN_TRAINING):
            error_line(run("train", "-s", src, "-t", tgt, "-o", model, *args, ok=False))
        first = RunRecord.load(str(model))
        run("train", "-s", src, "-t", tgt, "-o", model, *args, "--resume")
    elapsed = time.time() - start
    record = RunRecord.load(str(model))
    assert record.stages[:len(first.stages)] == first.stages   # appended, nothing lost
    assert [(s["session"], s["round"], s["stage"], s.get("direction")) for s in record.stages] \
        == [(0, 1, "teacher", None), (0, 1, "preparation", None), (0, 1, "training", "fwd"),
            (0, 1, "training", "rev"), (0, 1, "guide", None), (0, 2, "preparation", None),
            (1, 2, "training", "fwd"), (1, 2, "training", "rev"), (1, 2, "calibration", None)]
    first_session, resumed = record.sessions
    assert not first_session["resumed"] and resumed["resumed"]
    assert resumed["argv"][0] == "align"   # the command line (here pytest's argv)
    assert first_session["inputs"]["bitext"] == {
        "source": os.path.abspath(src), "target": os.path.abspath(tgt), "pairs": 12,
        "sha256": json.loads((model / "rounds" / "1" / "corpus" / "inputs.json").read_text()
                             )["sha256"]}
    assert first_session["threads"] == 1 and not first_session["parallel_directions"]
    per_round = {r: sum(s["seconds"] for s in record.stages if s["round"] == r) for r in (1, 2)}
    assert record.wall_seconds() == pytest.approx(sum(per_round.values()))
    assert 0 < record.wall_seconds() < elapsed
    assert not record.earlier_unrecorded


def test_overwrite_removes_an_earlier_runs_round_files_before_round_1(tmp_path, corpus):
    """A self-training run over another one's directory (--overwrite), cut off in round 1,
    resumes round 1: the earlier run's rounds and its published model are gone before it
    trains."""
    src, tgt = corpus
    args = ["--rounds", "2", "--max-updates", "4", "--checkpoint-interval", "2", *TRAIN_TINY]
    model = tmp_path / "m"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", model, *args, "--seed", "7")
        assert _links(model, 1).exists()
        with cut_off_at_checkpoint(1):
            error_line(run("train", "-s", src, "-t", tgt, "-o", model, *args, "--overwrite",
                           ok=False))
        assert not _links(model, 1).exists() and not (model / "rounds" / "2").exists()
        assert not (model / "config.json").exists() and not (model / "fwd").exists()
        run("train", "-s", src, "-t", tgt, "-o", model, *args, "--resume")
        assert "[fwd] resumed at update 2" in \
            (model / "rounds" / "1" / "train.log").read_text()
        run("train", "-s", src, "-t", tgt, "-o", tmp_path / "whole", *args)
    assert _links(model, 1).read_text() == _links(tmp_path / "whole", 1).read_text()


def test_resume_with_more_rounds_goes_on_from_a_finished_run(tmp_path, corpus):
    """A finished two-round run given --rounds 3 --resume aligns the bitext with its round-2
    model and trains round 3: the directory of a three-round run from the start."""
    src, tgt = corpus
    args = ["--max-updates", "3", *TRAIN_TINY]
    two, three = tmp_path / "two", tmp_path / "three"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", two, "--rounds", "2", *args)
        assert not _links(two, 2).exists()
        run("train", "-s", src, "-t", tgt, "-o", two, "--rounds", "3", "--resume", *args)
        run("train", "-s", src, "-t", tgt, "-o", three, "--rounds", "3", *args)
    for round_number in (1, 2):
        assert _links(two, round_number).read_text() == _links(three, round_number).read_text()
    assert _config(two)["extra"]["self_training"] == {"round": 3}
    assert _config(two)["extra"]["align_run"] == _config(three)["extra"]["align_run"]
    for model in (two, three):
        run("extract", model, "-s", src, "-t", tgt, "-o", tmp_path / f"{model.name}.x", "-q")
    assert (tmp_path / "two.x").read_text() == (tmp_path / "three.x").read_text()


def test_resume_checks_what_a_trained_round_does_not_retrain(tmp_path, corpus):
    """A round whose training ended is not taken for trained unless the state says so (an
    --afresh run cut off in round 2, resumed as fine-tuning: refused as other settings), and
    going on from a trained round checks the data and settings as train() does."""
    src, tgt = corpus
    args = ["--rounds", "2", "--max-updates", "4", "--checkpoint-interval", "2", *TRAIN_TINY]
    model = tmp_path / "m"
    with restored_aligner_logger():
        with cut_off_at_checkpoint(5):             # round 2, fwd's first checkpoint
            error_line(run("train", "-s", src, "-t", tgt, "-o", model, *args, "--afresh",
                           ok=False))
        assert _done_rounds(model) == [1]
        config = (model / "rounds" / "2" / "config.json").read_text()
        line = error_line(run("train", "-s", src, "-t", tgt, "-o", model, *args, "--resume",
                              ok=False))      # the run's guides came from --afresh rounds
        assert ("self-training settings differ from the saved run: --fine-tune/--afresh "
                "(False saved, True asked)") in line
        assert (model / "rounds" / "2" / "config.json").read_text() == config
        run("train", "-s", src, "-t", tgt, "-o", model, *args, "--resume", "--afresh")
        # finished; more rounds on other data, or with another learning rate: refused
        sources, targets, _ = monotone_corpus(12, seed=9)
        other_src, other_tgt, _ = write_corpus(tmp_path, "other", sources, targets)
        more = [*args[2:], "--rounds", "3", "--resume", "--afresh"]
        line = error_line(run("train", "-s", other_src, "-t", other_tgt, "-o", model, *more,
                              ok=False))
        assert "not the data the run's corpus was built from" in line
        line = error_line(run("train", "-s", src, "-t", tgt, "-o", model, *more, "--lr",
                              "1e-3", ok=False))
        assert "settings differ from the saved run: training.lr" in line
        assert not _links(model, 2).exists()
        run("train", "-s", src, "-t", tgt, "-o", model, *more)
    assert _links(model, 2).exists()
    assert "self-training guide" in (model / "rounds" / "2" / "train.log").read_text()
    assert _done_rounds(model) == [1, 2, 3]
