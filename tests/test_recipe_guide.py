"""`align train --model alignment-layer` without --guide: stage 0 trains the recipe and its links
of the bitext guide the layer (aligner/training/recipe_guide.py); cut off for real by SIGKILL
in each stage, --resume ends as a run that was not; --overwrite and a foreign directory."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from aligner import faults
from aligner.training import recipe
from cli_runner import error_line, run
from conftest import ROOT, restored_aligner_logger
from synthetic import monotone_corpus, write_corpus

#: a tiny base and layer (the recipe of stage 0 is the recipe's own model)
TINY = ["--model", "alignment-layer", "--bpe-merges", "20", "--d-model", "16", "--heads", "2",
        "--encoder-layers", "1", "--decoder-layers", "1", "--ff-dim", "32", "--max-tokens",
        "200", "--warmup", "2", "--checkpoint-interval", "3", "--max-updates", "3",
        "--threads", "1", "-q"]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """A layer trained without --guide on a tiny corpus, not cut off, and `align run` on the
    same corpus and seed: (corpus paths, model directory, the layer's alignments of the
    corpus, align run's output)."""
    folder = tmp_path_factory.mktemp("whole")
    sources, targets, golds = monotone_corpus(30, seed=2)
    src, tgt, _ = write_corpus(folder, "c", sources, targets, golds)
    corpus = ["-s", str(src), "-t", str(tgt)]
    model = folder / "model"
    with restored_aligner_logger():   # a module fixture: outside the per-test restoration
        run("train", *corpus, "-o", model, *TINY)
        run("extract", model, *corpus, "-o", folder / "layer.align", "-q")
        run("run", *corpus, "--model-dir", folder / "recipe", "-o", folder / "recipe.align",
            "--threads", "1", "-q")
    return dict(corpus=corpus, model=model, n=len(sources),
                layer=(folder / "layer.align").read_text(),
                recipe=(folder / "recipe.align").read_text())


def test_without_guide_the_layer_learns_the_recipes_links_of_the_bitext(whole):
    model = whole["model"]
    links = model / "guide" / "links.align"
    # stage 0 is the recipe: its links are align run's output on the same text and seed
    assert links.read_text() == whole["recipe"]
    assert len(whole["recipe"].splitlines()) == whole["n"] and "-" in whole["recipe"]
    guide_run = json.loads((model / "guide" / "config.json").read_text())
    assert guide_run["model_kind"] == recipe.MODEL_KIND
    assert sorted(os.listdir(model / "guide" / "rounds")) == sorted(   # 0: the teacher's links
        [str(r) for r in range(0 if recipe.TEACHER else 1, recipe.ROUNDS + 1)]
        + ["settings.json"])
    # stage 2 is the guided layer (Zenkel et al. 2020) on those links; the base has no guide
    config = json.loads((model / "config.json").read_text())
    assert config["data"]["guide"] == str(links)
    assert config["training"]["guide_weight"] == recipe.LAYER_GUIDE_WEIGHT
    assert config["models"]["fwd"]["layer_query"] == "target"
    base = json.loads((model / "base" / "config.json").read_text())
    assert base["data"]["guide"] == "" and base["training"]["guide_weight"] == 0
    # the layer decays its rate linearly, the base as any other run (--max-updates given:
    # both stop there)
    assert config["training"]["lr_schedule"] == recipe.LAYER_LR_SCHEDULE == "linear"
    assert base["training"]["lr_schedule"] == recipe.TRAINING["lr_schedule"]
    # --max-updates alone: each stage stops at it or at its own epochs, whichever comes first
    assert (config["training"]["max_epochs"], config["training"]["max_updates"]) == \
        (recipe.LAYER_EPOCHS, 3)
    assert (base["training"]["max_epochs"], base["training"]["max_updates"]) == \
        (recipe.EPOCHS, 3)
    assert len(whole["layer"].splitlines()) == whole["n"]


def test_the_guided_layer_trains_longer_than_its_base_unless_told(tmp_path, whole):
    """No --max-epochs / --max-updates: the base trains recipe.EPOCHS epochs, the guided
    layer recipe.LAYER_EPOCHS with the linear decay; a given limit or schedule holds for
    both stages, and the 2019 layer (no guide) trains as any other run."""
    guide = whole["model"] / "guide" / "links.align"
    unlimited = [flag for k, flag in enumerate(TINY)
                 if flag != "--max-updates" and (k == 0 or TINY[k - 1] != "--max-updates")]
    runs = {"default": ["--guide", guide],
            "given": ["--guide", guide, "--max-epochs", "1", "--lr-schedule", "inverse-sqrt"],
            "prefix": ["--layer-query", "prefix"]}
    for name, flags in runs.items():
        run("train", *whole["corpus"], "-o", tmp_path / name, *unlimited, *flags)

    def training(folder):
        config = json.loads((folder / "config.json").read_text())["training"]
        return config["max_epochs"], config["max_updates"], config["lr_schedule"]

    assert recipe.LAYER_EPOCHS != recipe.EPOCHS
    assert training(tmp_path / "default") == (recipe.LAYER_EPOCHS, 0, "linear")
    assert training(tmp_path / "default" / "base") == (recipe.EPOCHS, 0, "inverse-sqrt")
    updates = [int(line.split("\t")[0]) for line in (tmp_path / "default" / "fwd" /
               "metrics.tsv").read_text().splitlines()[1:]]
    base_updates = [int(line.split("\t")[0]) for line in (tmp_path / "default" / "base" / "fwd"
                    / "metrics.tsv").read_text().splitlines()[1:]]
    # the same batches per epoch: LAYER_EPOCHS / EPOCHS times the base's updates
    assert max(updates) * recipe.EPOCHS == max(base_updates) * recipe.LAYER_EPOCHS
    for folder in (tmp_path / "given", tmp_path / "given" / "base"):
        assert training(folder) == (1, 0, "inverse-sqrt")
    assert training(tmp_path / "prefix") == (recipe.EPOCHS, 0, "inverse-sqrt")


def test_the_2019_layer_and_a_given_guide_train_no_recipe(tmp_path, whole):
    for name, flags in (("prefix", ["--layer-query", "prefix"]),
                        ("given", ["--guide", whole["model"] / "guide" / "links.align"])):
        run("train", *whole["corpus"], "-o", tmp_path / name, *TINY, *flags)
        assert not (tmp_path / name / "guide").exists()
    assert json.loads((tmp_path / "given" / "config.json").read_text())["data"]["guide"] == str(
        whole["model"] / "guide" / "links.align")


def _killed(model, corpus, spec, *flags):
    """`align train` of the layer in a process of its own, cut off by SIGKILL at `spec`."""
    killed = subprocess.run([sys.executable, "-m", "aligner", "train", *corpus, "-o",
                             str(model), *TINY, *flags], cwd=ROOT, capture_output=True,
                            text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), faults.ENV: spec})
    assert killed.returncode == -signal.SIGKILL, killed.stderr


def _sessions(folder):
    """Whether each session of the run in `folder` (its run.json) was resumed."""
    record = json.loads((folder / "run.json").read_text())
    return [session["resumed"] for session in record["sessions"]]


#: where the run is cut off: the stage's folder, and its run's sessions once resumed (a stage
#: cut off before its training began starts again). With R = recipe.ROUNDS: stage 0 in the
#: recipe's round 2 (fwd's checkpoint written: one per direction and round), stage 0's
#: alignment of the bitext (its one block finished, after the R - 1 guides' blocks, the links
#: not written), stage 1 while it prepares (the recipe's R rounds prepared first) and after
#: the base's fwd checkpoint (the 2R of stage 0 came first), stage 2 while it prepares and
#: after the layer's fwd checkpoint
_R = recipe.ROUNDS
GUIDE_ALIGNMENT = f"alignment-block:{_R}"
LAYER_CHECKPOINT = f"checkpoint:{2 * _R + 3}"
STAGES = {"checkpoint:3": ("guide", [False, True]),
          GUIDE_ALIGNMENT: ("guide", [False, True]),
          f"preparation:{_R + 1}": ("base", [False]),
          f"checkpoint:{2 * _R + 1}": ("base", [False, True]),
          f"preparation:{_R + 2}": (".", [False]), LAYER_CHECKPOINT: (".", [False, True])}


@pytest.mark.parametrize("spec", STAGES)
def test_a_layer_run_killed_in_any_stage_ends_as_an_uninterrupted_run(tmp_path, whole, spec):
    folder, sessions = STAGES[spec]
    model = tmp_path / "model"
    _killed(model, whole["corpus"], spec)
    links = model / "guide" / "links.align"
    assert links.exists() == (folder != "guide")
    assert not (model / "config.json").exists() or spec == LAYER_CHECKPOINT
    if spec == LAYER_CHECKPOINT:   # a directory moved before it is resumed goes on as well
        model = model.rename(tmp_path / "moved")
        links = model / "guide" / "links.align"
    run("train", *whole["corpus"], "-o", model, *TINY, "--resume")
    assert _sessions(model / folder) == sessions
    assert links.read_text() == whole["recipe"]
    run("extract", model, *whole["corpus"], "-o", tmp_path / "layer.align", "-q")
    assert (tmp_path / "layer.align").read_text() == whole["layer"]
    assert not [p for p in model.rglob("*.tmp")]


def test_resume_refuses_before_stage_0_what_a_later_stage_would(tmp_path, whole):
    corpus = whole["corpus"]
    line = error_line(run("train", *corpus, "-o", tmp_path / "none", *TINY, "--resume",
                          ok=False))
    assert "nothing to resume" in line and not (tmp_path / "none").exists()
    # a layer of 2019 (no guide) resumed as the guided default: refused, no guide trained
    prefix = tmp_path / "prefix"
    run("train", *corpus, "-o", prefix, *TINY, "--layer-query", "prefix")
    line = error_line(run("train", *corpus, "-o", prefix, *TINY, "--resume", ok=False))
    assert "not on the recipe's links of the bitext" in line
    assert not (prefix / "guide").exists()
    # a finished guide resumed on another bitext: the recipe's run refuses it
    # (its rounds done, cut off before the first block of its alignment of the bitext)
    model = tmp_path / "model"
    _killed(model, corpus, GUIDE_ALIGNMENT)
    shutil.rmtree(model / "guide" / "links.align.parts")
    other = tmp_path / "other.src"
    other.write_text(open(corpus[1]).read().replace("\n", " x\n", 1))
    line = error_line(run("train", "-s", other, "-t", corpus[3], "-o", model, *TINY,
                          "--resume", ok=False))
    assert "not the data the run's corpus was built from" in line
    assert not (model / "guide" / "links.align").exists() and not (model / "base").exists()


def test_overwrite_trains_the_guide_again_and_keeps_the_users_files(tmp_path, whole):
    # a directory that holds no run of ours is refused before stage 0 writes anything
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine\n")
    line = error_line(run("train", *whole["corpus"], "-o", foreign, *TINY, ok=False))
    assert "directory is not empty" in line and sorted(os.listdir(foreign)) == ["notes.txt"]
    line = error_line(run("train", *whole["corpus"], "-o", foreign, *TINY, "--overwrite",
                          ok=False))
    assert "holds no run" in line and sorted(os.listdir(foreign)) == ["notes.txt"]
    # a layer run of ours with a guide that is not its recipe's (and parts of another
    # alignment): --overwrite trains it anew
    model = tmp_path / "model"
    shutil.copytree(whole["model"], model)
    (model / "guide" / "links.align").write_text("0-0\n" * whole["n"])
    (model / "guide" / "links.align.parts").mkdir()
    for folder in (model, model / "guide", model / "base"):
        (folder / "mine.txt").write_text("keep\n")
    # cut off in stage 0 of the new run: the replaced run's guide, base and layer are gone,
    # and --resume goes on with the new run alone
    _killed(model, whole["corpus"], "checkpoint:1", "--overwrite")
    assert not [path for path in ("guide/links.align", "guide/links.align.parts",
                                  "base/config.json", "base/fwd", "config.json", "fwd")
                if (model / path).exists()]
    run("train", *whole["corpus"], "-o", model, *TINY, "--resume")
    assert (model / "guide" / "links.align").read_text() == whole["recipe"]
    assert all((folder / "mine.txt").read_text() == "keep\n"
               for folder in (model, model / "guide", model / "base"))
    run("extract", model, *whole["corpus"], "-o", tmp_path / "layer.align", "-q")
    assert (tmp_path / "layer.align").read_text() == whole["layer"]
    run("train", *whole["corpus"], "-o", model, *TINY, "--overwrite")   # done: anew
    assert (model / "guide" / "links.align").read_text() == whole["recipe"]
    assert _sessions(model / "guide") == [False]
