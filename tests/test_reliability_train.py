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
TINY = ["--bpe-merges", "20", "--d-model", "16", "--heads", "2", "--encoder-layers", "1",
        "--decoder-layers", "1", "--ff-dim", "32", "--max-tokens", "200", "--warmup", "2",
        "--lr", "3e-3", "--checkpoint-interval", "2", "--device", "cpu", "-q"]


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
