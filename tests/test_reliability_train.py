"""`align train` under hostile use: the run lock, --resume with changed data or lost training
state, options validated before anything is written, validation gold checked against its
sentences, and a --parallel-directions run that ends without noise on stderr."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from aligner import constants as C
from aligner.cli import main
from aligner.model_dir import LOCK_NAME, acquire_lock, prepare_output_dir, release_lock
from aligner.utils import AlignerError
from synthetic import monotone_corpus, write_corpus

ROOT = Path(__file__).resolve().parent.parent
#: one training run each (--rounds 1; self-training rounds: tests/test_self_training.py)
TINY = ["--bpe-merges", "20", "--d-model", "16", "--heads", "2", "--encoder-layers", "1",
        "--decoder-layers", "1", "--ff-dim", "32", "--max-tokens", "200", "--warmup", "2",
        "--lr", "3e-3", "--checkpoint-interval", "2", "--device", "cpu", "-q", "--rounds", "1"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def run(*args):
    result = invoke(*args)
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def one_error_line(result) -> str:
    """The single `align: error:` line of a failed command (and no traceback)."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("align: error:")]
    assert len(errors) == 1, result.output
    return errors[0]


@pytest.fixture
def corpus(tmp_path):
    sources, targets, golds = monotone_corpus(40, seed=4)
    src, tgt, _ = write_corpus(tmp_path, "train", sources, targets, golds)
    vsrc, vtgt, vgold = write_corpus(tmp_path, "valid", sources[:6], targets[:6], golds[:6])
    return {"src": src, "tgt": tgt, "vsrc": vsrc, "vtgt": vtgt, "vgold": vgold}


# -- the run lock --------------------------------------------------------------------------

def test_a_lock_file_naming_an_unrelated_live_process_does_not_block(tmp_path):
    lock_file = tmp_path / LOCK_NAME
    lock_file.write_text(f"{os.getppid()}\n")  # a live process that is not training
    lock = acquire_lock(str(tmp_path))
    assert lock_file.read_text().startswith(f"pid {os.getpid()} on host ")
    # the lock does not make a fresh directory look like an earlier run
    assert prepare_output_dir(str(tmp_path), resume=False, overwrite=False) is False
    release_lock(lock)
    assert not lock_file.exists()


def test_the_lock_is_held_while_its_process_lives_and_dies_with_it(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from aligner.model_dir import acquire_lock; "
                               f"lock = acquire_lock({str(tmp_path)!r}); print('locked', "
                               "flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(AlignerError, match=f"another training process \\(pid {holder.pid} "
                                               f"on host "):
            acquire_lock(str(tmp_path))
    finally:
        holder.kill()  # no clean-up: the .lock file stays behind
        holder.wait()
    assert (tmp_path / LOCK_NAME).exists()
    release_lock(acquire_lock(str(tmp_path)))


def test_train_runs_beside_a_lock_file_of_an_unrelated_process(tmp_path, corpus):
    model = tmp_path / "m"
    model.mkdir()
    (model / LOCK_NAME).write_text(f"{os.getppid()}\n")
    run("train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model, "--max-updates", 2,
        *TINY)
    assert (model / "fwd" / C.PARAMS_BEST).exists()
    assert not (model / LOCK_NAME).exists()


# -- --parallel-directions: a successful run ends quietly ----------------------------------

#: a sitecustomize for the training processes of --parallel-directions: fwd's interpreter
#: shutdown is slow (as torch's finalizers sometimes are) and rev sends its result 3 s late, so
#: fwd is still shutting down when the parent has both results: the moment a parent that
#: terminates finished processes would hit it
SLOW_FWD_EXIT = textwrap.dedent("""
    import atexit, multiprocessing, time
    from multiprocessing import connection

    def _name():
        return multiprocessing.current_process().name

    _send = connection.Connection.send

    def _late_rev_send(self, obj):
        if _name() == "train-rev":
            time.sleep(3)
        _send(self, obj)

    def _slow_fwd_exit():
        if _name() == "train-fwd":
            time.sleep(6)

    connection.Connection.send = _late_rev_send
    atexit.register(_slow_fwd_exit)
""")


def test_a_successful_parallel_run_prints_no_traceback(tmp_path, corpus):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_FWD_EXIT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    model = tmp_path / "m"
    result = subprocess.run(
        [sys.executable, "-m", "aligner", "train", "-s", str(corpus["src"]), "-t",
         str(corpus["tgt"]), "-o", str(model), "--model", "hmm1", "--max-updates", "3",
         "--parallel-directions", "--threads", "2", *TINY],
        env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, \
        result.stderr
    assert "leaked semaphore" not in result.stderr, result.stderr
    assert "training fwd, rev in parallel" in (model / C.LOG_NAME).read_text()


# -- --resume with other data, or without a direction's training state ---------------------

def train_args(corpus, model, *more):
    return ["train", "-s", corpus["src"], "-t", corpus["tgt"], "-o", model, *more, *TINY]


def test_resume_refuses_other_training_data(tmp_path, corpus):
    model = tmp_path / "m"
    run(*train_args(corpus, model, "--max-updates", 2))
    sources, targets, _ = monotone_corpus(40, seed=5)
    other_src, other_tgt, _ = write_corpus(tmp_path, "other", sources, targets)
    config = (model / C.CONFIG_NAME).read_text()
    resumed = ["train", "-s", other_src, "-t", other_tgt, "-o", model, "--max-updates", 4,
               "--resume", *TINY]
    error = one_error_line(invoke(*resumed))
    assert f"{other_src} + {other_tgt}: not the data the run's corpus was built from" in error
    assert "--overwrite" in error and "--resume-ignore-data-change" in error
    assert (model / C.CONFIG_NAME).read_text() == config  # nothing trained or written
    assert "[fwd] checkpoint 4" not in (model / C.LOG_NAME).read_text()
    # asked for: training goes on, on the cached corpus
    run(*resumed, "--resume-ignore-data-change")
    assert "[fwd] checkpoint 4" in (model / C.LOG_NAME).read_text()


def test_resume_refuses_training_data_changed_in_place(tmp_path, corpus):
    model = tmp_path / "m"
    run(*train_args(corpus, model, "--max-updates", 2))
    # the same text under another name is the same data
    copy = tmp_path / "copy.src"
    copy.write_text(corpus["src"].read_text())
    run("train", "-s", copy, "-t", corpus["tgt"], "-o", model, "--max-updates", 3, "--resume",
        *TINY)
    with open(corpus["tgt"], "a", encoding="utf-8") as handle:
        handle.write("t1 t2\n")
    with open(corpus["src"], "a", encoding="utf-8") as handle:
        handle.write("s1 s2\n")
    error = one_error_line(invoke(*train_args(corpus, model, "--max-updates", 4, "--resume")))
    assert "changed since the run's corpus was built from it: 40 pairs then, 41 now" in error


def test_ignore_data_change_needs_resume(tmp_path, corpus):
    error = one_error_line(invoke(*train_args(corpus, tmp_path / "m", "--max-updates", 2,
                                              "--resume-ignore-data-change")))
    assert "--resume-ignore-data-change applies to --resume only" in error


@pytest.mark.parametrize("parallel", [[], ["--parallel-directions"]])
def test_resume_never_retrains_a_direction_without_training_state(tmp_path, corpus, parallel):
    model = tmp_path / "m"
    run(*train_args(corpus, model, "--max-updates", 4))
    (model / "fwd" / C.TRAINING_STATE).unlink()
    weights = {name: (model / d / name).read_bytes()
               for d in C.DIRECTIONS for name in (C.PARAMS_BEST, C.PARAMS_LAST)}
    error = one_error_line(invoke(*train_args(corpus, model, "--max-updates", 6, "--resume",
                                              *parallel)))
    assert f"{model / 'fwd' / C.TRAINING_STATE}: missing, but {C.PARAMS_LAST}" in error
    assert "--overwrite" in error
    assert weights == {name: (model / d / name).read_bytes()  # rev untouched too
                       for d in C.DIRECTIONS for name in (C.PARAMS_BEST, C.PARAMS_LAST)}


def test_resume_before_the_first_checkpoint_starts_the_direction_afresh(tmp_path, corpus):
    """A direction folder with neither weights nor state (the run stopped before its first
    checkpoint) is trained from the start, as before."""
    model = tmp_path / "m"
    run(*train_args(corpus, model, "--max-updates", 2))
    for path in (model / "rev").iterdir():
        path.unlink()
    run(*train_args(corpus, model, "--max-updates", 2, "--resume"))
    assert (model / "rev" / C.PARAMS_LAST).exists()


# -- options checked before anything is written ---------------------------------------------

@pytest.mark.parametrize("bad, message", [
    (["-M", "bogus=1"], "--model-option: unknown setting bogus for --model hmm1"),
    (["--model", "alignment-layer", "-M", "bogus=1"],
     "--model-option: unknown setting bogus for --model alignment-layer"),
    (["--model", "hmm1", "-M", "forward_algorithm=sideways"], "forward_algorithm must be"),
    (["--valid-method", "bogus"], "--valid-method: unknown method 'bogus' for --model "
                                  "hmm1 (choose from hmm-posterior, hmm-viterbi, "
                                  "hmm-alignment)"),
    (["--model", "hmm0", "--valid-method", "hmm-viterbi"],
     "--valid-method: unknown method 'hmm-viterbi' for --model hmm0"),
])
def test_bad_options_fail_before_anything_is_written(tmp_path, corpus, bad, message):
    model = tmp_path / "m"
    error = one_error_line(invoke(*train_args(corpus, model, "--max-updates", 2, *bad)))
    assert message in error
    assert not model.exists()
    # so the corrected command needs no --overwrite
    run(*train_args(corpus, model, "--max-updates", 1, "--directions", "fwd"))


@pytest.mark.parametrize("gold_format", ["talp", "naacl"])
def test_validation_gold_link_outside_its_sentence_is_refused(tmp_path, corpus, gold_format):
    lines = corpus["vgold"].read_text().splitlines()
    lines[2] += " 0-9"  # sentence 3 has 4 words on each side
    if gold_format == "talp":
        gold = tmp_path / "bad.talp"
        gold.write_text("\n".join(lines) + "\n")
        where = f"{gold}:3: link '0-9' outside the sentence pair"
    else:
        gold = tmp_path / "bad.naacl"
        gold.write_text("".join(f"{k} {int(i) + 1} {int(j) + 1}\n"
                                for k, line in enumerate(lines, 1)
                                for i, j in (link.split("-") for link in line.split())))
        where = f"{gold}: sentence 3: link '1 10' outside the sentence pair"
    model = tmp_path / "m"
    error = one_error_line(invoke(*train_args(
        corpus, model, "--max-updates", 2, "--valid-src", corpus["vsrc"], "--valid-tgt",
        corpus["vtgt"], "--valid-gold", gold, "--valid-gold-format", gold_format)))
    assert where in error
    assert not model.exists()
