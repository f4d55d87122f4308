"""Every core at work on a whole-bitext alignment (aligner.corpus_alignment.BlockProcesses):
how many processes, and the same bytes from 2 processes as from 1, for align extract (its
outputs and link probabilities) and align run (-o, -f, -r), as real processes."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from aligner import corpus_alignment
from conftest import ROOT
from synthetic import monotone_corpus, write_corpus
from test_extract import make_model_dir

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
ALIGN = [sys.executable, "-m", "aligner"]
SAMPLE = ROOT / "data" / "sample"


def test_block_processes_one_per_core_at_most_one_per_block(monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(corpus_alignment, "cpu_cores", lambda: 16)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    assert corpus_alignment.block_processes(0, cpu, 41) == 16     # every core
    assert corpus_alignment.block_processes(0, cpu, 5) == 5       # at most one per block
    assert corpus_alignment.block_processes(3, cpu, 41) == 3      # as asked
    assert corpus_alignment.block_processes(0, cpu, 1) == 1       # one block: this process
    assert corpus_alignment.block_processes(0, gpu, 41) == 1      # a GPU: this process
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)     # --threads 4
    assert corpus_alignment.block_processes(0, cpu, 41) == 4


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_block_process_killed_ends_the_alignment_in_one_line(tmp_path):
    """SIGKILL of one block process (as the OOM killer would): the command ends with one
    error line and a non-zero status instead of waiting for the lost block forever; the
    finished blocks stay for --resume."""
    import signal
    import time

    from test_faults import _cmdline, _descendants

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
        workers = [pid for pid in _descendants(process.pid) if "spawn_main" in _cmdline(pid)]
        assert len(workers) == 2, workers
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
    # tracker may then warn about it at exit (its lines, not ours; none with SIGTERM)
    assert all("resource_tracker" in line for line in lines[1:]), stderr
    assert not out.exists() and list(tmp_path.glob("out.parts/block*.json"))


def _extract(model, src, tgt, out, processes, *more):
    result = subprocess.run([*ALIGN, "extract", str(model), "-s", str(src), "-t", str(tgt),
                             "-o", str(out), "--block-lines", "200", "--processes",
                             str(processes), *more], env=ENV, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


@pytest.mark.parametrize("more", [[], ["-H", "soft-average", "--threshold", "0.2"]])
def test_extract_in_two_processes_writes_the_one_process_bytes(tmp_path, more):
    model, _, _ = make_model_dir(tmp_path)
    sources, targets, _ = monotone_corpus(2000, seed=4)
    sources[7] = []                                      # an empty side among the blocks
    src, tgt, _ = write_corpus(tmp_path, "corpus", sources, targets)
    one, two = tmp_path / "one", tmp_path / "two"
    _extract(model, src, tgt, one, 1, "--link-probs", str(one) + ".probs", *more)
    log = _extract(model, src, tgt, two, 2, "--link-probs", str(two) + ".probs", *more)
    assert "10 blocks of 200 lines in 2 processes" in log
    assert "corpus.src:8: an empty side: writing an empty alignment" in log   # its line
    assert two.read_bytes() == one.read_bytes() and one.read_text().count("\n") == 2000
    assert (tmp_path / "two.probs").read_bytes() == (tmp_path / "one.probs").read_bytes()
    assert one.read_text().splitlines()[7] == ""
    assert sorted(os.listdir(tmp_path)) == sorted(["model", "corpus.src", "corpus.tgt", "one",
                                                   "one.probs", "two", "two.probs"])


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="the shipped sample is not there")
def test_align_run_in_two_processes_writes_the_one_process_bytes(tmp_path):
    """The final alignment of align run (the recipe's shape at a tiny size): -o, -f and -r of
    2 block processes equal those of 1, byte for byte."""
    outputs = {}
    for processes in (1, 2):
        out = tmp_path / f"p{processes}"
        result = subprocess.run(
            [*ALIGN, "run", "-s", str(SAMPLE / "train.en"), "-t", str(SAMPLE / "train.fr"),
             "-o", f"{out}.align", "-f", f"{out}.fwd", "-r", f"{out}.rev",
             "--model-dir", str(out), "--processes", str(processes), "--block-lines", "500",
             "-M", "d_model=16", "-M", "n_heads=2", "-M", "enc_layers=1", "-M",
             "dec_layers=1", "-M", "d_ff=32", "--bpe-merges", "0", "--max-updates", "2",
             "--round-pairs", "300", "--seed", "3"],
            env=ENV, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        assert ("in 2 processes" in result.stderr) == (processes == 2), result.stderr[-3000:]
        outputs[processes] = [open(f"{out}.{name}", "rb").read()
                              for name in ("align", "fwd", "rev")]
    assert outputs[1] == outputs[2]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_sigterm_of_extract_stops_its_block_processes(tmp_path):
    """`kill PID` of align extract while its block processes work: one error line, a
    non-zero status, and no block process left running (they would hold the model's memory
    and finish their blocks for nobody)."""
    import signal
    import time

    from test_faults import _cmdline, _descendants, _state

    model, _, _ = make_model_dir(tmp_path)
    sources, targets, _ = monotone_corpus(2000, seed=4)
    src, tgt, _ = write_corpus(tmp_path, "corpus", sources, targets)
    process = subprocess.Popen([*ALIGN, "extract", str(model), "-s", str(src), "-t", str(tgt),
                                "-o", str(tmp_path / "out"), "--block-lines", "20",
                                "--processes", "2", "-q"], env=ENV, stderr=subprocess.PIPE,
                               text=True)
    try:
        deadline = time.time() + 300
        while not list(tmp_path.glob("out.parts/block*.json")):
            assert process.poll() is None, process.stderr.read()
            assert time.time() < deadline
            time.sleep(0.01)
        everything = _descendants(process.pid)
        assert len([pid for pid in everything if "spawn_main" in _cmdline(pid)]) == 2
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode not in (0, -signal.SIGTERM), stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "terminated (SIGTERM)" in lines[0], stderr
    deadline = time.time() + 10
    while [pid for pid in everything if _state(pid) not in ("", "Z")] and time.time() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in everything if _state(pid) not in ("", "Z")]
