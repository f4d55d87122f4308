"""Every core at work on a whole-bitext alignment (aligner.extract.corpus_alignment.BlockProcesses):
how many processes, and the same bytes from 2 processes as from 1, for align extract (its
outputs and link probabilities) and align run (-o, -f, -r), as real processes."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import processes

from aligner.extract import corpus_alignment
from conftest import ROOT
from synthetic import monotone_corpus, write_corpus
from test_extract import make_model_dir

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
ALIGN = [sys.executable, "-m", "aligner"]
SAMPLE = ROOT / "data" / "sample"


def test_block_processes_one_per_core_at_most_one_per_block(monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(corpus_alignment, "cpu_cores", lambda: 16)
    monkeypatch.setattr(corpus_alignment, "available_memory", lambda: None)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    assert corpus_alignment.block_processes(0, cpu, 41) == 16     # every core
    assert corpus_alignment.block_processes(0, cpu, 5) == 5       # at most one per block
    assert corpus_alignment.block_processes(3, cpu, 41) == 3      # as asked
    assert corpus_alignment.block_processes(0, cpu, 1) == 1       # one block: this process
    assert corpus_alignment.block_processes(0, gpu, 41) == 1      # a GPU: this process
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)     # --threads 4
    assert corpus_alignment.block_processes(0, cpu, 41) == 4


def test_block_processes_no_more_than_the_available_memory_holds(monkeypatch):
    """By default one process per core, but no more than fit into the available memory at
    the expected bytes of each; at least one; --processes N as asked; memory unknown: a
    process per core."""
    cpu, gib = torch.device("cpu"), 1 << 30
    monkeypatch.setattr(corpus_alignment, "cpu_cores", lambda: 16)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    monkeypatch.setattr(corpus_alignment, "available_memory", lambda: 7 * gib + 5)
    assert corpus_alignment.block_processes(0, cpu, 41, 2 * gib) == 3
    assert corpus_alignment.block_processes(0, cpu, 41, gib // 2) == 14
    assert corpus_alignment.block_processes(0, cpu, 41, gib // 4) == 16     # every core fits
    assert corpus_alignment.block_processes(0, cpu, 41, 8 * gib) == 1       # at least one
    assert corpus_alignment.block_processes(12, cpu, 41, 2 * gib) == 12     # as asked
    monkeypatch.setattr(corpus_alignment, "available_memory", lambda: None)
    assert corpus_alignment.block_processes(0, cpu, 41, 2 * gib) == 16


def test_available_memory_reads_the_kernel_and_the_cgroup(monkeypatch, tmp_path):
    """MemAvailable of /proc/meminfo, or the cgroup's limit less its usage where lower; a
    cgroup without a limit ("max") does not count."""
    import builtins

    files = {"/proc/meminfo": "MemTotal: 9000 kB\nMemAvailable:    4000 kB\n",
             "/sys/fs/cgroup/memory.max": "3000000\n",
             "/sys/fs/cgroup/memory.current": "1000000\n"}
    real_open = builtins.open

    def fake_open(path, *args, **kwargs):
        if str(path) in files:
            target = tmp_path / str(path).replace("/", "_")
            target.write_text(files[str(path)])
            return real_open(target, *args, **kwargs)
        if str(path).startswith(("/sys/fs/cgroup", "/proc/meminfo")):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    assert corpus_alignment.available_memory() == 2_000_000        # the cgroup leaves less
    files["/sys/fs/cgroup/memory.max"] = "max\n"
    assert corpus_alignment.available_memory() == 4000 * 1024      # no limit: the kernel's
    del files["/proc/meminfo"], files["/sys/fs/cgroup/memory.max"]
    assert corpus_alignment.available_memory() is None


def test_a_block_process_is_expected_to_hold_its_teacher_twice(tmp_path):
    """block_process_bytes: the base, and twice the mixture's weight files."""
    from types import SimpleNamespace

    for direction, size in (("fwd", 1000), ("rev", 3000)):
        (tmp_path / direction).mkdir()
        (tmp_path / direction / "params.best.pt").write_bytes(bytes(size))
    with_teacher = SimpleNamespace(mixture=SimpleNamespace(path=str(tmp_path)))
    assert corpus_alignment.block_process_bytes(with_teacher) == \
        corpus_alignment.BLOCK_PROCESS_BYTES + 8000
    assert corpus_alignment.block_process_bytes(SimpleNamespace(mixture=None)) == \
        corpus_alignment.BLOCK_PROCESS_BYTES


def _extract_in_two_block_processes(tmp_path):
    """`align extract` of 2,000 lines in blocks of 20 by 2 block processes, as a real process,
    once its first block is finished: (the process, -o, its 2 block processes)."""
    import time

    model, _, _ = make_model_dir(tmp_path)
    sources, targets, _ = monotone_corpus(2000, seed=4)
    src, tgt, _ = write_corpus(tmp_path, "corpus", sources, targets)
    out = tmp_path / "out"
    process = subprocess.Popen([*ALIGN, "extract", str(model), "-s", str(src), "-t", str(tgt),
                                "-o", str(out), "--block-lines", "20", "--processes", "2",
                                "-q"], env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not list(tmp_path.glob("out.parts/block*.json")):
            assert process.poll() is None, process.stderr.read()
            assert time.time() < deadline
            time.sleep(0.01)
        # the 2 block processes: live "spawn" children (a third spawn_main process may show
        # for an instant, gone at the next look: polled until the count settles)
        while True:
            workers = [pid for pid in processes.workers(process.pid)
                       if pid in processes.children(process.pid)]
            if len(workers) == 2 or time.time() > deadline:
                break
            time.sleep(0.05)
        assert len(workers) == 2, workers
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process, out, workers


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_block_process_killed_ends_the_alignment_in_one_line(tmp_path):
    """SIGKILL of one block process (as the OOM killer would): the command ends with one
    error line and a non-zero status instead of waiting for the lost block forever; the
    finished blocks stay for --resume."""
    import signal

    process, out, workers = _extract_in_two_block_processes(tmp_path)
    try:
        os.kill(workers[0], signal.SIGKILL)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1, stderr
    lines = stderr.strip().splitlines()
    assert lines[0].startswith("align: error: ") and "a block process ended" in lines[0], stderr
    # a process killed by SIGKILL cannot give back a semaphore it held: Python's resource
    # tracker may then warn about it at exit (its lines, not ours)
    assert all("resource_tracker" in line for line in lines[1:]), stderr
    assert not out.exists() and list(tmp_path.glob("out.parts/block*.json"))


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_sigterm_of_extract_stops_its_block_processes(tmp_path):
    """`kill PID` of align extract while its block processes work: one error line, a
    non-zero status, and no block process left running (they would hold the model's memory
    and finish their blocks for nobody)."""
    import signal

    process, _, _ = _extract_in_two_block_processes(tmp_path)
    everything = processes.descendants(process.pid)
    stderr = processes.terminate(process)
    assert process.returncode not in (0, -signal.SIGTERM), stderr
    lines = stderr.strip().splitlines()
    assert lines[0].startswith("align: error: ") and "terminated (SIGTERM)" in lines[0], stderr
    # one line of ours; on a loaded machine a block process slow to stop may still leave
    # Python's resource tracker a semaphore to warn about at exit (its lines, as above)
    assert all("resource_tracker" in line for line in lines[1:]), stderr
    assert not processes.left_running(everything)


def _sleep_through_sigterm(ready) -> None:
    """A process that ignores SIGTERM, as a block process blocked on a queue lock after
    its SystemExit was taken for its block's error."""
    import signal
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(600)


def _sleep(ready) -> None:
    import time

    ready.set()
    time.sleep(600)


def test_stop_processes_kills_a_process_that_outlives_its_sigterm():
    """stop_processes ends one that obeys SIGTERM by SIGTERM and one that ignores it by
    SIGKILL once the grace time is over: a block process stuck after its SIGTERM cannot make
    the whole alignment wait forever."""
    import multiprocessing
    import signal
    import time

    context = multiprocessing.get_context("fork")
    events = [context.Event(), context.Event()]
    stubborn = context.Process(target=_sleep_through_sigterm, args=(events[0],))
    obedient = context.Process(target=_sleep, args=(events[1],))
    for process, ready in zip((stubborn, obedient), events):
        process.start()
        assert ready.wait(60)
    try:
        started = time.monotonic()
        corpus_alignment.stop_processes([stubborn, obedient], grace_s=1.0)
        stubborn.join(30)
        obedient.join(30)
        assert time.monotonic() - started < 30
        assert obedient.exitcode == -signal.SIGTERM
        assert stubborn.exitcode == -signal.SIGKILL
    finally:
        for process in (stubborn, obedient):
            if process.is_alive():
                process.kill()
                process.join()
