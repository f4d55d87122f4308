"""The public fault-injection point (aligner/faults.py), and `align run` cut off for real by
SIGKILL at each stage of the recipe, then finished by `align run --resume`."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from aligner import faults
from aligner.utils import AlignerError
from cli_runner import error_line, run
import processes
from conftest import ROOT, restored_aligner_logger
from synthetic import monotone_corpus, write_corpus


@pytest.mark.parametrize("spec, expected", [
    ("checkpoint", ("checkpoint", 1, "kill")),
    ("round-start:3", ("round-start", 3, "kill")),
    ("alignment-block:2:interrupt", ("alignment-block", 2, "interrupt")),
])
def test_a_spec_names_the_point_the_pass_and_the_action(spec, expected):
    assert faults.parse(spec) == expected


@pytest.mark.parametrize("spec", ["nowhere", "checkpoint:0", "checkpoint:x", "checkpoint:2:pause",
                                  "checkpoint:1:kill:3"])
def test_a_bad_spec_is_refused(spec):
    with pytest.raises(AlignerError, match="ALIGNER_FAULT"):
        faults.parse(spec)


def test_a_bad_spec_in_the_environment_is_one_line(tmp_path, monkeypatch):
    sources, targets, golds = monotone_corpus(6, seed=1)
    src, tgt, _ = write_corpus(tmp_path, "c", sources, targets, golds)
    monkeypatch.setenv(faults.ENV, "checkpont:2")
    line = error_line(run("train", "-s", src, "-t", tgt, "-o", tmp_path / "m", "--rounds", "1",
                          "--max-updates", "1", *TINY, ok=False))
    assert "ALIGNER_FAULT='checkpont:2'" in line


def test_injected_cuts_off_at_the_counted_pass_only_inside_the_block():
    faults.reached("checkpoint")                    # not armed: nothing happens
    with faults.injected("checkpoint", 3):
        faults.reached("checkpoint")
        faults.reached("round-start")               # another point is not counted
        faults.reached("checkpoint")
        with pytest.raises(KeyboardInterrupt):
            faults.reached("checkpoint")
        faults.reached("checkpoint")                # the fourth pass goes on
    faults.reached("checkpoint")


TINY = ["--d-model", "16", "--heads", "2", "--encoder-layers", "1", "--decoder-layers", "1",
        "--ff-dim", "32", "--max-positions", "12", "--max-len", "11", "--bpe-merges", "0",
        "--threads", "1", "-q"]
RUN_TINY = ["-M", "d_model=16", "-M", "n_heads=2", "-M", "enc_layers=1", "-M", "dec_layers=1",
            "-M", "d_ff=32", "-M", "max_positions=12", "--bpe-merges", "0", "--threads", "1",
            "--rounds", "2", "--max-updates", "4", "-q"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """A 2-round `align run` of a tiny corpus, not cut off: (its arguments, output text)."""
    folder = tmp_path_factory.mktemp("whole")
    sources, targets, golds = monotone_corpus(12, seed=4)
    src, tgt, _ = write_corpus(folder, "c", sources, targets, golds)
    common = ["-s", str(src), "-t", str(tgt), *RUN_TINY]
    with restored_aligner_logger():   # a module fixture: outside the per-test restoration
        run("run", *common, "--model-dir", folder / "model", "-o", folder / "whole.align")
    return common, (folder / "whole.align").read_text()


#: each stage of `align run` (2 rounds of 4 updates, one checkpoint per direction and round,
#: fwd's then rev's): the teacher (round 1's guide) as it begins, round 2's preparation (round
#: 1's is the first pass), round 2's training after fwd's checkpoint (rev not trained), the
#: start of round 2 (round 1's links written), the alignment between the rounds, the final
#: alignment (the guide's block is the first pass)
STAGES = ["teacher:1", "preparation:2", "checkpoint:3", "round-start:1", "guide-alignment:1",
          "alignment-block:2"]


@pytest.mark.parametrize("spec", STAGES)
def test_align_run_killed_at_any_stage_ends_as_an_uninterrupted_run(tmp_path, uninterrupted,
                                                                    spec):
    common, expected = uninterrupted
    model, output = tmp_path / "model", tmp_path / "cut.align"
    killed = subprocess.run([sys.executable, "-m", "aligner", "run", *common, "--model-dir",
                             str(model), "-o", str(output)], cwd=ROOT, capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT),
                                            faults.ENV: spec})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not output.exists()
    run("run", *common, "--model-dir", model, "-o", output, "--resume")
    assert output.read_text() == expected
    assert not [p for p in model.rglob("*.tmp")]


# -- SIGTERM (`kill PID`, `timeout`, a job scheduler) of `align run` without --model-dir ---------

SAMPLE = ROOT / "data" / "sample"
#: a tiny model of the recipe's kind on the shipped sample (3,000 lines: the teacher runs in a
#: process of its own, the final alignment's blocks of 1,000 lines in two direction workers)
SAMPLE_TINY = ["-M", "d_model=16", "-M", "n_heads=2", "-M", "enc_layers=1", "-M",
               "dec_layers=1", "-M", "d_ff=32", "--bpe-merges", "0", "--max-updates", "2",
               "--threads", "2", "-q"]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
@pytest.mark.parametrize("stage", ["teacher", "final-alignment"])
def test_sigterm_of_align_run_removes_its_temporary_model_and_its_workers(tmp_path, stage):
    """`kill PID` of `align run` without --model-dir while the teacher trains (in a process of
    its own) or while the final alignment runs (in two direction workers): one error line, a
    non-zero exit, no align-run-* directory left in TMPDIR, no worker left running, no
    output written. It used to die on the spot (status 143, no message), leaving both."""
    tmpdir, output = tmp_path / "tmp", tmp_path / "out.align"
    tmpdir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmpdir)}
    args = ["-s", str(SAMPLE / "train.en"), "-t", str(SAMPLE / "train.fr"), "-o", str(output),
            *SAMPLE_TINY]
    if stage == "teacher":
        args += ["--rounds", "2"]
    else:   # stopped once the first block of the final alignment is written
        args += ["--rounds", "1", "--no-teacher", "--block-lines", "1000"]
        env[faults.ENV] = "alignment-block:1:stop"
    process = subprocess.Popen([sys.executable, "-m", "aligner", "run", *args], cwd=ROOT,
                               env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        workers = []
        while process.poll() is None and time.time() < deadline:
            workers = processes.workers(process.pid)
            if stage == "teacher" and workers:
                break
            if stage == "final-alignment" and processes.state(process.pid) == "T":
                break
            time.sleep(0.1)
        assert process.poll() is None, process.stderr.read()
        assert len(workers) == (1 if stage == "teacher" else 2), workers
        assert list(tmpdir.glob("align-run-*"))
        if stage == "teacher":
            time.sleep(1)   # inside the teacher's EM
        everything = processes.descendants(process.pid)
        stderr = processes.terminate(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode not in (0, -signal.SIGTERM), stderr
    assert stderr.strip().splitlines() == [
        "align: error: terminated (SIGTERM); the model was in a temporary directory, now "
        "removed (give --model-dir to be able to resume)"], stderr
    assert not list(tmpdir.glob("align-run-*"))
    assert not output.exists()
    assert not processes.left_running(everything)
