"""Faults a user can run into, each ending in one error line and nothing lost: --overwrite
removes only a run of ours (never the user's files or a run's inputs), outputs never replace
inputs, devices or FIFOs, symbolic links are not followed, a full disk or a file size limit
leaves the last good checkpoint, non-finite settings are refused, a resumed run is checked
for its settings (self-training ones too) but not for how its paths are spelled, and an
interrupted `align run` goes on with --resume (after SIGKILL too)."""
from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import cli_runner
from cli_runner import error_line
from conftest import cut_off_at_checkpoint, restored_aligner_logger
from synthetic import monotone_corpus, write_corpus

ROOT = Path(__file__).resolve().parent.parent
#: a tiny model of the default kind (hmm1), one training run (--rounds 1)
TINY = ["--bpe-merges", "20", "--d-model", "16", "--heads", "2", "--encoder-layers", "1",
        "--decoder-layers", "1", "--ff-dim", "32", "--max-tokens", "200", "--warmup", "2",
        "--lr", "3e-3", "--checkpoint-interval", "2", "--device", "cpu", "-q", "--rounds", "1",
        "--threads", "1"]
#: a tiny hmm1, as the self-training tests train it
HMM_TINY = ["--model", "hmm1", "--d-model", "16", "--heads", "2", "--encoder-layers", "1",
            "--decoder-layers", "1", "--ff-dim", "32", "--max-positions", "12", "--max-len",
            "11", "--bpe-merges", "0", "--threads", "1", "--max-epochs", "0", "-q"]
RUN_TINY = ["-M", "d_model=16", "-M", "n_heads=2", "-M", "enc_layers=1", "-M", "dec_layers=1",
            "-M", "d_ff=32", "-M", "max_positions=12", "--bpe-merges", "0", "--threads", "1",
            "-q"]


def invoke(*args):
    """`align ARGS...` in-process, whatever its exit status; the aligner logger restored."""
    with restored_aligner_logger():
        return cli_runner.run(*args, ok=False)


def run(*args):
    """`align ARGS...` in-process, asserting exit status 0; the aligner logger restored."""
    with restored_aligner_logger():
        return cli_runner.run(*args)


def snapshot(directory: Path) -> dict:
    """{relative path: bytes} of every file under `directory`."""
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def corpus(tmp_path):
    sources, targets, golds = monotone_corpus(40, seed=4)
    src, tgt, gold = write_corpus(tmp_path, "train", sources, targets, golds)
    return {"src": src, "tgt": tgt, "gold": gold, "n": 40}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model directory (the default kind, hmm1) and its data (never modified by the
    tests)."""
    root = tmp_path_factory.mktemp("trained")
    sources, targets, golds = monotone_corpus(40, seed=4)
    src, tgt, gold = write_corpus(root, "train", sources, targets, golds)
    run("train", "-s", src, "-t", tgt, "-o", root / "model", "--max-updates", 2, *TINY)
    return {"model": root / "model", "src": src, "tgt": tgt, "gold": gold}


# -- --overwrite removes only a run of ours, never an input ------------------------------------

def test_overwrite_refuses_a_directory_without_a_run_and_keeps_the_users_corpus(tmp_path):
    work = tmp_path / "work"
    (work / "corpus").mkdir(parents=True)
    sources, targets, _ = monotone_corpus(20, seed=1)
    src, tgt, _ = write_corpus(work / "corpus", "s", sources, targets)
    before = snapshot(work)
    (work / "version").write_text("1.4.2\n")      # the project's own version file
    before = snapshot(work)
    line = error_line(invoke("train", "-s", src, "-t", tgt, "-o", work, "--overwrite",
                                 *TINY))
    assert "holds no run" in line and "nothing was removed" in line
    assert snapshot(work) == before
    # align run --model-dir: a user's fwd/ and a config.json of another program
    (work / "fwd").mkdir()
    (work / "fwd" / "notes.txt").write_text("mine")
    (work / "config.json").write_text('{"learning_rate": 0.1}')
    before = snapshot(work)
    line = error_line(invoke("run", "-s", src, "-t", tgt, "--model-dir", work,
                                 "--overwrite", "--max-updates", 2, "-o", tmp_path / "out",
                                 *RUN_TINY))
    assert "holds no run" in line
    assert snapshot(work) == before


def test_overwrite_never_removes_an_input_inside_the_run(tmp_path, trained):
    model = tmp_path / "model"
    run("train", "-s", trained["src"], "-t", trained["tgt"], "-o", model, "--max-updates", 2,
        *TINY)
    inside = model / "corpus" / "mine.src"       # the user keeps the bitext in corpus/
    inside.write_bytes(Path(trained["src"]).read_bytes())
    before = snapshot(model)
    line = error_line(invoke("train", "-s", inside, "-t", trained["tgt"], "-o", model,
                                 "--overwrite", "--max-updates", 2, *TINY))
    assert "an input of this run lies in" in line and "nothing was removed" in line
    assert snapshot(model) == before


def test_overwrite_refuses_a_symlinked_run_entry_before_removing_anything(tmp_path, trained):
    model = tmp_path / "model"
    run("train", "-s", trained["src"], "-t", trained["tgt"], "-o", model, "--max-updates", 2,
        *TINY)
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    import shutil
    shutil.rmtree(model / "corpus")
    (model / "corpus").symlink_to(elsewhere, target_is_directory=True)
    before = snapshot(model)
    line = error_line(invoke("train", "-s", trained["src"], "-t", trained["tgt"], "-o",
                                 model, "--overwrite", "--max-updates", 2, *TINY))
    assert "corpus: a symbolic link" in line
    assert (elsewhere / "keep.txt").read_text() == "mine"
    assert (model / "config.json").exists() and snapshot(model) == before


def test_every_input_is_checked_before_an_overwrite_removes_anything(tmp_path, corpus):
    model = tmp_path / "m"
    args = ["--rounds", "2", "--max-updates", "2", "--checkpoint-interval", "2", *HMM_TINY]
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model, *args)
    before = snapshot(model)
    assert "rounds/settings.json" in before and "rounds/1/links.align" in before
    short_guide = tmp_path / "short.align"
    short_guide.write_text("0-0\n" * 5)            # 5 lines for a 40-line bitext
    line = error_line(invoke("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model,
                                 *args, "--overwrite", "--guide", short_guide))
    assert "short.align: 5 lines, but the training bitext has 40" in line
    assert snapshot(model) == before
    line = error_line(invoke("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model,
                                 *args, "--overwrite", "-M", "no_such_option=3"))
    assert "no_such_option" in line
    assert snapshot(model) == before               # the rounds too


def test_a_run_stopped_before_training_leaves_nothing_behind(tmp_path, corpus):
    """A guide link out of range that only tokenization reveals stops the run in its
    preparation: the corrected command then runs without --overwrite or --resume."""
    src = tmp_path / "tok.src"
    tgt = tmp_path / "tok.tgt"
    src.write_text("a.\n" * 10)                   # --tokenize: "a ." (2 words)
    tgt.write_text("b\n" * 10)
    guide = tmp_path / "g.align"
    guide.write_text("1-0\n" * 9 + "0-0 0-5\n")    # target word 5 does not exist
    model = tmp_path / "m"
    args = ["-s", src, "-t", tgt, "-o", model, "--tokenize", "--max-updates", 2,
            "--model", "hmm0", "--d-model", "16", "--heads", "2", "--encoder-layers", "1",
            "--decoder-layers", "1", "--ff-dim", "32", "--bpe-merges", "0", "--rounds", "1",
            "--threads", "1", "-q"]
    line = error_line(invoke("train", *args, "--guide", guide))
    assert "g.align:10: link 0-5 outside the sentence pair" in line
    assert not model.exists() or os.listdir(model) == []
    run("train", *args)
    assert (model / "config.json").exists()


# -- outputs: never an input, never each other, devices and FIFOs written in place -------------

def test_an_output_that_names_an_input_or_another_output_is_refused(tmp_path, trained):
    src_copy = tmp_path / "v.src"
    src_copy.write_bytes(Path(trained["src"]).read_bytes())
    before = src_copy.read_bytes()
    line = error_line(invoke("extract", trained["model"], "-s", src_copy, "-t",
                                 trained["tgt"], "-o", src_copy, "-q"))
    assert "-o names the input file of -s" in line
    assert src_copy.read_bytes() == before
    out = tmp_path / "x.align"
    line = error_line(invoke("run", "-s", trained["src"], "-t", trained["tgt"], "-o", out,
                                 "-f", out, *RUN_TINY))
    assert "-o and -f name the same file" in line
    line = error_line(invoke("symmetrize", "-f", out, "-r", trained["gold"], "-o",
                                 tmp_path / "." / "x.align"))
    assert "names the input file of -f" in line


def test_one_terminal_may_be_the_input_and_the_output(tmp_path):
    """Written in place, a terminal is not replaced: `-f /dev/stdin -o /dev/stdout` on one
    terminal (both name the same device) reads the links typed and prints the result."""
    import pty

    links = tmp_path / "r.align"
    links.write_text("0-0 1-1\n")
    master, terminal = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "aligner", "symmetrize", "-f",
                                "/dev/stdin", "-r", links, "-H", "intersect", "-o",
                                "/dev/stdout", "-q"], stdin=terminal, stdout=terminal,
                               stderr=subprocess.PIPE, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(terminal)
    os.write(master, b"0-0 1-1 1-0\n\x04")           # a line, then end of input (Ctrl-D)
    _, stderr = process.communicate(timeout=120)
    printed = b""
    with contextlib.suppress(OSError):                # EIO once the terminal has no writer
        while chunk := os.read(master, 1024):
            printed += chunk
    os.close(master)
    assert process.returncode == 0, stderr
    assert b"0-0 1-1\r\n" in printed.split(b"1-0\r\n", 1)[-1]


def test_devices_and_fifos_are_written_in_place(tmp_path, trained):
    run("extract", trained["model"], "-s", trained["src"], "-t", trained["tgt"], "-o",
        "/dev/null", "-q")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    fifo = tmp_path / "links.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    run("symmetrize", "-f", trained["gold"], "-r", trained["gold"], "-o", fifo, "-q")
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert received[0] == Path(trained["gold"]).read_text()   # the diagonal, intersected


def test_a_full_device_is_error_line(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    links = tmp_path / "links.align"
    links.write_text("0-0 1-1\n" * 1000)
    line = error_line(invoke("symmetrize", "-f", links, "-r", links, "-o", "/dev/full",
                                 "-q"))
    assert line == "align: error: /dev/full: cannot write: No space left on device (the disk is full)"


def test_an_unwritable_model_directory_parent_is_error_line(tmp_path, corpus):
    parent = tmp_path / "a_file"
    parent.write_text("not a directory")
    line = error_line(invoke("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o",
                                 parent / "model", *TINY))
    assert "a_file" in line


# -- symbolic links in a model directory are not followed --------------------------------------

def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path, corpus):
    target = tmp_path / "victim.txt"
    target.write_text("precious\n")
    model = tmp_path / "m"
    model.mkdir()
    (model / ".lock").symlink_to(target)
    line = error_line(invoke("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o",
                                 model, "--max-updates", 2, *TINY))
    assert ".lock: cannot open the run lock: a symbolic link" in line
    assert target.read_text() == "precious\n"


def test_a_symlinked_log_is_refused_and_its_target_untouched(tmp_path, corpus):
    model = tmp_path / "m"
    args = ["-s", corpus["src"], "-t", corpus["tgt"], "-o", model, *TINY]
    run("train", *args, "--max-updates", 2)
    target = tmp_path / "victim.txt"
    target.write_text("precious\n")
    (model / "train.log").unlink()
    (model / "train.log").symlink_to(target)
    line = error_line(invoke("train", *args, "--max-updates", 4, "--resume"))
    assert "train.log: cannot open the log: a symbolic link" in line
    assert target.read_text() == "precious\n"


# -- checkpoints: weights and state one unit; non-finite training stops ------------------------

def _train_subprocess(args, limit_bytes=None):
    """`align train ARGS` in a child process, its files limited to `limit_bytes` (RLIMIT_FSIZE:
    a larger write fails with EFBIG, as a full disk fails with ENOSPC)."""
    def limit():
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return subprocess.run([sys.executable, "-m", "aligner", "train", *map(str, args)],
                          preexec_fn=limit, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_write_failure_between_weights_and_state_resumes_from_one_checkpoint(tmp_path,
                                                                             corpus):
    """params.last.pt of update 4 is written, training_state.pt is not (its file is too large
    for the limit): one error line, and --resume continues from update 2's weights AND state,
    ending with an uninterrupted run's weights."""
    args = ["-s", corpus["src"], "-t", corpus["tgt"], "--directions", "fwd", *TINY]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for model in (whole, cut):
        done = _train_subprocess([*args, "-o", model, "--max-updates", 2])
        assert done.returncode == 0, done.stderr
    done = _train_subprocess([*args, "-o", whole, "--max-updates", 4, "--resume"])
    assert done.returncode == 0, done.stderr
    weights = (cut / "fwd" / "params.last.pt").stat().st_size
    state = (cut / "fwd" / "training_state.pt").stat().st_size
    assert state > 2 * weights
    failed = _train_subprocess([*args, "-o", cut, "--max-updates", 4, "--resume"],
                               limit_bytes=(weights + state) // 2)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr
    assert "training_state.pt: cannot write: File too large" in failed.stderr
    done = _train_subprocess([*args, "-o", cut, "--max-updates", 4, "--resume"])
    assert done.returncode == 0, done.stderr
    assert "resumed at update 2" in (cut / "train.log").read_text()
    ours = torch.load(cut / "fwd" / "params.last.pt", weights_only=True)["state_dict"]
    theirs = torch.load(whole / "fwd" / "params.last.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert not [p for p in (cut / "fwd").iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("option,value", [("--lr", "inf"), ("--guide-weight", "inf"),
                                          ("--agreement-weight", "inf"),
                                          ("--self-guide-weight", "inf"), ("--dropout", "nan"),
                                          ("--label-smoothing", "nan")])
def test_non_finite_settings_are_refused(corpus, tmp_path, option, value):
    result = invoke("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", tmp_path / "m",
                    *TINY, option, value)
    assert result.exit_code == 2 and "is not a finite number" in result.output, result.output
    result = invoke("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", tmp_path / "m",
                    "-M", "dropout=NaN", *TINY)
    assert "--model-option dropout=NaN: not a finite number" in error_line(result)
    assert not (tmp_path / "m").exists()


def test_a_diverging_run_stops_with_one_line_and_keeps_no_nan_checkpoint(corpus, tmp_path):
    model = tmp_path / "m"
    line = error_line(invoke("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model,
                                 "--directions", "fwd", *TINY, "--lr", "1e6", "--warmup", "0",
                                 "--checkpoint-interval", "1", "--max-updates", 30))
    assert "not finite" in line and "the last checkpoint" in line.lower()
    state = model / "fwd" / "params.last.pt"
    if state.exists():   # what was written is finite
        weights = torch.load(state, weights_only=True)["state_dict"]
        assert all(bool(torch.isfinite(v).all()) for v in weights.values()
                   if v.is_floating_point())


# -- resume: settings checked, paths not -------------------------------------------------------

def test_resuming_self_training_with_another_guide_threshold_is_refused(tmp_path, corpus):
    model = tmp_path / "m"
    args = ["-s", corpus["src"], "-t", corpus["tgt"], "-o", model, "--rounds", "2",
            "--max-updates", "2", "--checkpoint-interval", "2", *HMM_TINY]
    run("train", *args)
    state = json.loads((model / "rounds" / "settings.json").read_text())
    assert state["settings"]["--self-guide-threshold"] == 0.5
    line = error_line(invoke("train", *args, "--rounds", "3", "--resume",
                                 "--self-guide-threshold", "0.55"))
    assert "--self-guide-threshold (0.5 saved, 0.55 asked)" in line
    run("train", *args, "--rounds", "3", "--resume")      # the same settings go on


def test_a_run_resumes_however_its_directory_is_spelled(tmp_path, corpus):
    """Cut off in round 2 (whose guide is MODEL_DIR/rounds/1/links.align), resumed as
    ./DIR, by absolute path, and after the directory moved."""
    args = ["-s", corpus["src"], "-t", corpus["tgt"], "--rounds", "3", "--max-updates", "4",
            "--checkpoint-interval", "2", *HMM_TINY]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with cut_off_at_checkpoint(5):              # round 2, fwd's first checkpoint
            error_line(invoke("train", *args, "-o", "i4"))
        with cut_off_at_checkpoint(5):              # ./i4 goes on, is cut off again
            error_line(invoke("train", *args, "-o", "./i4", "--resume"))
        os.rename("i4", "moved")
        run("train", *args, "-o", tmp_path / "moved", "--resume")
    finally:
        os.chdir(cwd)
    assert (tmp_path / "moved" / "rounds" / "3" / "done").exists()


def test_align_run_goes_on_with_resume_after_sigkill(tmp_path, corpus):
    """SIGKILL while round 2 trains (round 1's links are written); `align run --resume` ends with
    the output of an uninterrupted run, and no temporary file is left behind."""
    common = ["-s", corpus["src"], "-t", corpus["tgt"], "--rounds", "3", "--max-updates", "40",
              *RUN_TINY]
    whole = subprocess.run([sys.executable, "-m", "aligner", "run", *map(str, common),
                            "--model-dir", tmp_path / "whole", "-o", tmp_path / "whole.align"],
                           capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert whole.returncode == 0, whole.stderr
    model = tmp_path / "cut"
    process = subprocess.Popen([sys.executable, "-m", "aligner", "run", *map(str, common),
                                "--model-dir", model, "-o", tmp_path / "cut.align"],
                               cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (model / "rounds" / "1" / "links.align").exists() and process.poll() is None:
        assert time.time() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "cut.align").exists()
    line = error_line(invoke("run", *common, "--model-dir", model, "-o",
                                 tmp_path / "cut.align"))
    assert "use --resume to continue" in line
    run("run", *common, "--model-dir", model, "-o", tmp_path / "cut.align", "--resume")
    assert (tmp_path / "cut.align").read_text() == (tmp_path / "whole.align").read_text()
    assert not [p for p in model.iterdir() if p.name.endswith(".tmp")]


def test_stale_temporary_files_of_a_killed_run_are_removed_on_resume(tmp_path, trained):
    model = tmp_path / "m"
    run("train", "-s", trained["src"], "-t", trained["tgt"], "-o", model, "--max-updates", 2,
        *TINY)
    stale = [model / ".config.json.k3j4h5g6.tmp",
             model / "fwd" / ".params.last.pt.a1b2c3d4.tmp"]
    for path in stale:
        path.write_text("half")
    mine = model / "notes.tmp"
    mine.write_text("mine")
    run("train", "-s", trained["src"], "-t", trained["tgt"], "-o", model, "--max-updates", 4,
        *TINY, "--resume")
    assert not any(path.exists() for path in stale) and mine.exists()


# -- extraction defaults from config.json ------------------------------------------------------

@pytest.mark.parametrize("recorded,message", [
    ({"threshold": "high"}, "extra.align_run.threshold: 'high' is not a probability threshold"),
    ({"threshold": 5}, "extra.align_run.threshold: 5 is not a probability threshold"),
    ({"threshold": -1}, "extra.align_run.threshold: -1 is not a probability threshold"),
    ("x", "extra.align_run: expected"),
    ({"symmetrize": "nearest"}, "soft-average"),
    # null (a hand edit, another tool's writer) or the wrong type: one line, not a TypeError
    ({"symmetrize": "soft-average", "threshold": None},
     "extra.align_run.threshold: null is not a probability threshold"),
    ({"threshold": None}, "extra.align_run.threshold: null is not a probability threshold"),
    ({"threshold": True}, "extra.align_run.threshold: true is not a probability threshold"),
    ({"threshold": [0.5]}, "extra.align_run.threshold: [0.5] is not a probability threshold"),
    ({"symmetrize": None, "threshold": 0.5},
     "extra.align_run.symmetrize: null is not a heuristic"),
    ({"symmetrize": ["union"]}, "extra.align_run.symmetrize: ['union'] is not a heuristic"),
    ({"symmetrize": 3}, "extra.align_run.symmetrize: 3 is not a heuristic"),
    ({"mix_weight": 1.5}, "extra.align_run.mix_weight: 1.5 is not a weight"),
    ({"mix_weight": "0.2"}, "extra.align_run.mix_weight: '0.2' is not a weight"),
    ({"mix_length": -1}, "extra.align_run.mix_length: -1 is not a line length"),
    ({"mix_length": 12.5}, "extra.align_run.mix_length: 12.5 is not a line length")])
def test_bad_recorded_extraction_defaults_are_error_line(tmp_path, trained, recorded,
                                                             message):
    import shutil
    model = tmp_path / "model"
    shutil.copytree(trained["model"], model)
    config = json.loads((model / "config.json").read_text())
    config["extra"]["align_run"] = recorded
    (model / "config.json").write_text(json.dumps(config))
    line = error_line(invoke("extract", model, "-s", trained["src"], "-t", trained["tgt"],
                                 "-o", tmp_path / "out", "-q"))
    assert message in line and f"{model / 'config.json'}: " in line
    assert not (tmp_path / "out").exists()


def test_a_null_recorded_threshold_is_error_line_in_align_show_too(tmp_path, trained):
    """`align show` reads the recorded defaults as extract does (the Aligner API)."""
    pytest.importorskip("matplotlib")
    import shutil
    model = tmp_path / "model"
    shutil.copytree(trained["model"], model)
    config = json.loads((model / "config.json").read_text())
    config["extra"]["align_run"] = {"symmetrize": "soft-average", "threshold": None}
    (model / "config.json").write_text(json.dumps(config))
    line = error_line(invoke("show", model, "-s", trained["src"], "-t", trained["tgt"],
                             "--line", "1", "-o", tmp_path / "pair.png", "--device", "cpu"))
    assert f"{model / 'config.json'}: extra.align_run.threshold: null is not" in line
    assert not (tmp_path / "pair.png").exists()


def test_threshold_alone_applies_where_the_default_heuristic_is_soft_average(tmp_path, corpus):
    model = tmp_path / "hmm"
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model, "--rounds", "1",
        "--max-updates", "2", *HMM_TINY)
    low, high = tmp_path / "low", tmp_path / "high"
    for out, threshold in ((low, "0.05"), (high, "0.95")):
        run("extract", model, "-s", corpus["src"], "-t", corpus["tgt"], "-o", out,
            "--threshold", threshold, "-q")
    count = lambda path: sum(len(line.split()) for line in path.read_text().splitlines())  # noqa
    assert count(low) > count(high)
    transformer = tmp_path / "transformer"
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", transformer, "--model",
        "transformer", "--max-updates", 2, *TINY)
    line = error_line(invoke("extract", transformer, "-s", corpus["src"], "-t",
                                 corpus["tgt"], "--threshold", "0.3", "-q"))
    assert "default heuristic is grow-diag: give -H soft-average" in line


def test_a_guide_without_links_is_warned_about(tmp_path, corpus):
    empty = tmp_path / "empty.align"
    empty.write_text("\n" * corpus["n"])
    result = run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", tmp_path / "m",
                 "--rounds", "1", "--max-updates", "2", "--guide", empty,
                 *[a for a in HMM_TINY if a != "-q"])
    assert "the guide has no link on any line" in result.output


def test_resume_compares_the_start_model_by_its_weights(tmp_path, corpus):
    """A fine-tuning run resumed with another --init-from model (or none) is refused: a direction
    without a checkpoint would start from it. The same model elsewhere is accepted."""
    import shutil
    m1, m2, tuned = tmp_path / "m1", tmp_path / "m2", tmp_path / "tuned"
    args = ["-s", corpus["src"], "-t", corpus["tgt"], "--max-updates", 2, *TINY]
    run("train", *args, "-o", m1)
    run("train", *args, "-o", m2, "--seed", 7)
    run("train", *args, "-o", tuned, "--init-from", m1)
    line = error_line(invoke("train", *args, "-o", tuned, "--init-from", m2, "--resume",
                                 "--max-updates", 4))
    assert "m2: not the model the run started from" in line
    line = error_line(invoke("train", *args, "-o", tuned, "--resume", "--max-updates", 4))
    assert "settings differ" in line and "extra.init_from" in line
    shutil.move(str(m1), str(tmp_path / "moved"))
    run("train", *args, "-o", tuned, "--init-from", tmp_path / "moved", "--resume",
        "--max-updates", 4)


def test_a_guide_from_a_pipe_is_read_once(tmp_path, corpus):
    fifo = tmp_path / "guide.fifo"
    os.mkfifo(fifo)
    text = Path(corpus["gold"]).read_text()
    writer = threading.Thread(target=lambda: fifo.write_text(text))
    writer.start()
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", tmp_path / "m", "--rounds", "1",
        "--max-updates", "2", "--guide", fifo, *HMM_TINY)
    writer.join(timeout=30)
    assert not writer.is_alive()


def test_a_link_to_a_process_stream_is_written_in_place(tmp_path, corpus):
    """`-o /dev/stdout` with stdout redirected to a file: the file gets the output and the link
    stays a link (imitated by a link of our own to /proc/self/fd/1)."""
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    redirected = tmp_path / "redirected.txt"
    with open(redirected, "w") as out:
        done = subprocess.run([sys.executable, "-m", "aligner", "symmetrize", "-f",
                               corpus["gold"], "-r", corpus["gold"], "-o", link, "-q"],
                              stdout=out, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert link.is_symlink()
    assert redirected.read_text() == Path(corpus["gold"]).read_text()


def test_a_run_refused_by_its_batches_leaves_nothing_behind(tmp_path, corpus):
    model = tmp_path / "m"
    args = ["-s", corpus["src"], "-t", corpus["tgt"], "-o", model, "--max-updates", 2, *TINY]
    line = error_line(invoke("train", *args, "--max-tokens", 3))
    assert "--max-tokens 3 is smaller than the longest training pair" in line
    assert not model.exists() or os.listdir(model) == []
    run("train", *args)


# -- a full disk names the file: every write into the model directory -------------------------

SAMPLE = ROOT / "data" / "sample"
#: `align train` of one direction on the shipped sample (3,000 lines: corpus arrays of 200+ KB,
#: larger than the vocabularies and the configuration files)
SAMPLE_TRAIN = ["-s", SAMPLE / "train.en", "-t", SAMPLE / "train.fr", "--directions", "fwd",
                "--bpe-merges", "0", "--d-model", "16", "--heads", "2", "--encoder-layers", "1",
                "--decoder-layers", "1", "--ff-dim", "32", "--device", "cpu", "-q", "--rounds",
                "1", "--threads", "1"]


def _limited(args, limit_bytes):
    """`align ARGS` in a child process whose files may not grow past `limit_bytes`
    (RLIMIT_FSIZE; SIGXFSZ ignored, so that the write fails with EFBIG as a full disk fails
    with ENOSPC)."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return subprocess.run([sys.executable, "-m", "aligner", *map(str, args)], preexec_fn=limit,
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def _one_write_error(done) -> str:
    """The one stderr line of a run stopped by a write (exit 1, no traceback)."""
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("align: error: "), done.stderr
    return lines[0]


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory):
    """A finished `align train` of the sample (1 update): its directory is only read."""
    model = tmp_path_factory.mktemp("sample") / "model"
    done = _limited(["train", *SAMPLE_TRAIN, "-o", model, "--max-updates", 1], 1 << 40)
    assert done.returncode == 0, done.stderr
    return model


def test_a_full_disk_at_the_corpus_arrays_names_the_array(tmp_path, sample_run):
    """np.save of an id array used to say only '13609 requested and 8160 written'."""
    ids = (sample_run / "corpus" / "src.ids.npy").stat().st_size
    others = [p.stat().st_size for p in sample_run.rglob("*") if p.is_file()
              and p.parent.name != "corpus" and p.parent.name != "fwd"]
    assert max(others) < ids - 1000
    inputs = {p: p.read_bytes() for p in (SAMPLE / "train.en", SAMPLE / "train.fr")}
    line = _one_write_error(_limited(["train", *SAMPLE_TRAIN, "-o", tmp_path / "model",
                                      "--max-updates", 1], ids - 1000))
    assert line == (f"align: error: {tmp_path / 'model' / 'corpus' / 'src.ids.npy'}: cannot "
                    f"write: File too large (over the limit on file sizes: ulimit -f, or the "
                    f"file system's)")
    assert all(p.read_bytes() == data for p, data in inputs.items())
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]


def test_a_full_disk_at_a_checkpoint_names_the_checkpoint(tmp_path, sample_run):
    weights = (sample_run / "fwd" / "params.last.pt").stat().st_size
    corpus = max(p.stat().st_size for p in (sample_run / "corpus").iterdir())
    assert corpus < weights - 1000
    line = _one_write_error(_limited(["train", *SAMPLE_TRAIN, "-o", tmp_path / "model",
                                      "--max-updates", 1], weights - 1000))
    assert line.startswith(f"align: error: {tmp_path / 'model' / 'fwd'}{os.sep}")
    assert ".pt: cannot write: File too large (over the limit on file sizes" in line


@pytest.mark.parametrize("how,limit,name", [("--resume", 10, ".lock"),
                                            ("--resume", 1000, "run.json"),
                                            ("--overwrite", 10, ".lock")])
def test_a_full_disk_on_resume_or_overwrite_names_the_file_and_keeps_the_run(
        tmp_path, sample_run, how, limit, name):
    """--resume / --overwrite used to say only 'No space left on device': the file that
    cannot be written (the run lock, the first; the run record) is named, and the run is as it
    was (--overwrite has not removed it yet when its lock cannot be written)."""
    import shutil
    model = tmp_path / "model"
    shutil.copytree(sample_run, model)
    before = {k: v for k, v in snapshot(model).items() if k != "train.log"}
    line = _one_write_error(_limited(["train", *SAMPLE_TRAIN, "-o", model, "--max-updates", 2,
                                      how], limit))
    assert line == (f"align: error: {model / name}: cannot write: File too large (over the "
                    f"limit on file sizes: ulimit -f, or the file system's)")
    after = {k: v for k, v in snapshot(model).items() if k != "train.log"}
    assert after == before


def test_a_full_disk_in_the_first_checkpoint_resumes(tmp_path, corpus):
    """The first checkpoint of a direction cut off by a full disk (its training state, the
    larger file, does not fit): `--resume` used to refuse the directory ('use --overwrite':
    params.last.pt was written, training_state.pt was not); now the training state comes
    first, and --resume ends with the weights of an uninterrupted run."""
    args = ["-s", corpus["src"], "-t", corpus["tgt"], "--directions", "fwd", *TINY,
            "--max-updates", 4]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    done = _train_subprocess([*args, "-o", whole])
    assert done.returncode == 0, done.stderr
    weights = (whole / "fwd" / "params.last.pt").stat().st_size
    state = (whole / "fwd" / "training_state.pt").stat().st_size
    assert state > 2 * weights
    failed = _limited(["train", *args, "-o", cut], (weights + state) // 2)
    line = _one_write_error(failed)
    assert line.startswith(f"align: error: {cut / 'fwd' / 'training_state.pt'}: cannot write: "
                           f"File too large (")
    assert not (cut / "fwd" / "training_state.pt").exists()
    done = _train_subprocess([*args, "-o", cut, "--resume"])
    assert done.returncode == 0, done.stderr
    ours = torch.load(cut / "fwd" / "params.last.pt", weights_only=True)["state_dict"]
    theirs = torch.load(whole / "fwd" / "params.last.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert not [p for p in (cut / "fwd").iterdir() if p.name.endswith(".tmp")]
