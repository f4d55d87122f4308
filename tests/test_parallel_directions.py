"""`align train --parallel-directions`: fwd and rev trained at the same time in two CPU processes
give exactly the weights, metrics and checkpoints of training them one after the other."""
from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from aligner import constants as C
from aligner.cli import main
from aligner.model_dir import load_checkpoint_file
import processes
from synthetic import monotone_corpus, write_corpus

#: one training run each (--rounds 1; self-training rounds: tests/test_self_training.py)
TINY = ["--bpe-merges", "20", "--d-model", "16", "--heads", "2", "--encoder-layers", "1",
        "--decoder-layers", "1", "--ff-dim", "32", "--max-tokens", "200", "--warmup", "2",
        "--lr", "3e-3", "--checkpoint-interval", "2", "--max-epochs", "0", "--device", "cpu",
        "-q", "--rounds", "1"]
#: metrics.tsv columns that depend on the clock, not on the computation
TIMING_COLUMNS = ("tokens_per_s", "elapsed_s")


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result


@pytest.fixture
def corpus(tmp_path):
    sources, targets, golds = monotone_corpus(40, seed=4)
    src, tgt, _ = write_corpus(tmp_path, "train", sources, targets, golds)
    vsrc, vtgt, vgold = write_corpus(tmp_path, "valid", sources[:6], targets[:6], golds[:6])
    return ["-s", src, "-t", tgt, "--valid-src", vsrc, "--valid-tgt", vtgt,
            "--valid-gold", vgold]


def metrics_without_timing(path):
    header, *rows = path.read_text().splitlines()
    names = header.split("\t")
    keep = [k for k, name in enumerate(names) if name not in TIMING_COLUMNS]
    return [[row.split("\t")[k] for k in keep] for row in rows]


def assert_same_runs(one, other, directions=C.DIRECTIONS):
    for direction in directions:
        for name in (C.PARAMS_BEST, C.PARAMS_LAST):
            a = load_checkpoint_file(str(one / direction / name))["state_dict"]
            b = load_checkpoint_file(str(other / direction / name))["state_dict"]
            assert a.keys() == b.keys()
            for key in a:
                assert torch.equal(a[key], b[key]), (direction, name, key)
        assert (metrics_without_timing(one / direction / C.METRICS_NAME)
                == metrics_without_timing(other / direction / C.METRICS_NAME))


@pytest.mark.parametrize("kind", ["hmm1", "transformer"])
def test_parallel_equals_sequential(tmp_path, corpus, kind):
    # the test process runs torch with 1 thread (conftest): each direction's process gets 1
    assert torch.get_num_threads() == 1
    sequential, parallel = tmp_path / "sequential", tmp_path / "parallel"
    run("train", *corpus, "-o", sequential, "--model", kind, "--max-updates", 5, *TINY)
    run("train", *corpus, "-o", parallel, "--model", kind, "--max-updates", 5,
        "--parallel-directions", *TINY)
    assert_same_runs(sequential, parallel)
    log = (parallel / C.LOG_NAME).read_text()
    assert "training fwd, rev in parallel: 2 processes with 1 thread(s) each" in log
    assert "[fwd] done: 5 updates" in log and "[rev] done: 5 updates" in log  # children log too


def test_parallel_resume_and_two_stage_kind(tmp_path, corpus):
    """alignment-layer (base, then layer, both stages in parallel), stopped after 4 updates
    and resumed to 6, equals one sequential run of 6 (the inverse-sqrt schedule in both
    stages: the guided layer's default linear decay ends at its last update, which a resume
    cannot move)."""
    sequential, parallel = tmp_path / "sequential", tmp_path / "parallel"
    layer = ["--model", "alignment-layer", "--lr-schedule", "inverse-sqrt"]
    run("train", *corpus, "-o", sequential, *layer, "--max-updates", 6, *TINY)
    run("train", *corpus, "-o", parallel, *layer, "--max-updates", 4, "--parallel-directions",
        *TINY)
    run("train", *corpus, "-o", parallel, *layer, "--max-updates", 6, "--parallel-directions",
        "--resume", *TINY)
    assert_same_runs(sequential / "base", parallel / "base")
    assert_same_runs(sequential, parallel)


def test_one_direction_ignores_the_flag(tmp_path, corpus):
    run("train", *corpus, "-o", tmp_path / "m", "--directions", "rev", "--max-updates", 2,
        "--parallel-directions", *TINY)
    assert (tmp_path / "m" / "rev" / C.PARAMS_LAST).exists()
    assert not (tmp_path / "m" / "fwd").exists()
    assert "in parallel" not in (tmp_path / "m" / C.LOG_NAME).read_text()


def test_error_in_one_process_is_one_line(tmp_path, corpus):
    """A direction's process that fails (here: rev's training state is unreadable) ends the
    command with that process's one-line error, not a traceback."""
    model = tmp_path / "m"
    run("train", *corpus, "-o", model, "--max-updates", 2, "--parallel-directions", *TINY)
    (model / "rev" / C.TRAINING_STATE).write_bytes(b"not a checkpoint")
    result = CliRunner().invoke(main, [str(a) for a in (
        "train", *corpus, "-o", model, "--max-updates", 4, "--parallel-directions", "--resume",
        *TINY)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("align: error:")]
    assert len(errors) == 1 and C.TRAINING_STATE in errors[0], result.output


@pytest.mark.skipif(not __import__("os").path.isdir("/proc"), reason="reads /proc")
def test_sigterm_to_the_parent_stops_the_direction_processes(tmp_path, corpus):
    """`kill PID` of `align train --parallel-directions`: one error line, exit 1, and no
    direction process left training on its own."""
    import os
    import signal
    import subprocess
    import sys
    import time

    command = [sys.executable, "-m", "aligner", "train", *map(str, corpus), "-o",
               str(tmp_path / "model"), "--model", "hmm1", "--parallel-directions",
               "--max-updates", "100000", "--threads", "2", *TINY]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    workers = []
    try:
        deadline = time.time() + 120
        while len(workers) < 2 and time.time() < deadline and process.poll() is None:
            time.sleep(0.5)   # the two direction processes (spawn also starts a resource tracker)
            workers = [pid for pid in processes.children(process.pid)
                       if "spawn_main" in processes.cmdline(pid)]
        assert len(workers) >= 2, (process.stderr.read() if process.poll() is not None
                                   else workers)
        time.sleep(2)         # inside training
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 1
        assert "align: error: terminated (SIGTERM)" in stderr and "Traceback" not in stderr
        assert not processes.left_running(workers, wait=1)
    finally:   # a failed assertion must not leave a 100,000-update job training beside the
        for pid in {*workers, *processes.descendants(process.pid)}:     # next tests
            if "spawn_main" in processes.cmdline(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if process.poll() is None:
            process.kill()
            process.wait()


def test_directions_train_side_by_side_by_default_where_it_pays(monkeypatch):
    """align train / align run without --parallel-directions: side by side on a CPU with 2+
    cores and torch threads, both directions apart, one process, 1,000+ pairs."""
    import os

    import torch

    from aligner.training.directions import PARALLEL_MIN_PAIRS, default_parallel_directions

    cpu, both = torch.device("cpu"), ("fwd", "rev")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert default_parallel_directions(cpu, both, 0.0, PARALLEL_MIN_PAIRS)
        assert not default_parallel_directions(cpu, both, 0.0, PARALLEL_MIN_PAIRS - 1)
        assert not default_parallel_directions(cpu, both, 1.0, 10 ** 6)      # agreement
        assert not default_parallel_directions(cpu, ("fwd",), 0.0, 10 ** 6)
        assert not default_parallel_directions(torch.device("cuda"), both, 0.0, 10 ** 6)
        monkeypatch.setenv("WORLD_SIZE", "2")                                # torchrun
        assert not default_parallel_directions(cpu, both, 0.0, 10 ** 6)
        monkeypatch.delenv("WORLD_SIZE")
        torch.set_num_threads(1)                                             # --threads 1
        assert not default_parallel_directions(cpu, both, 0.0, 10 ** 6)
        # align demo: one thread for each direction
        assert default_parallel_directions(cpu, both, 0.0, 10 ** 6, one_thread_each=True)
        assert not default_parallel_directions(cpu, both, 0.0, PARALLEL_MIN_PAIRS - 1,
                                               one_thread_each=True)
        monkeypatch.setattr(os, "cpu_count", lambda: 1)
        torch.set_num_threads(2)
        assert not default_parallel_directions(cpu, both, 0.0, 10 ** 6)
    finally:
        torch.set_num_threads(threads)
