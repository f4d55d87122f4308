"""Whole-bitext alignment in blocks (aligner/extract/blocks.py, issue 30): a run of `align extract`
/ `align run` killed (SIGKILL) in its alignment goes on with --resume from the first unfinished
block and writes the uninterrupted run's output byte for byte; a resume with another model,
input or setting is refused in one line; torchrun's ranks share the blocks out and rank 0
writes the one-process output; one progress bar over the input lines.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from aligner import constants as C
from cli_runner import error_line, run
from conftest import ROOT, restored_aligner_logger
from synthetic import monotone_corpus, write_corpus
from test_extract import make_model_dir

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
ALIGN = [sys.executable, "-m", "aligner"]
LINES, BLOCK = 2000, 20              # 100 blocks: a SIGKILL lands among them


def _kill_when_a_block_is_finished(command, parts: str, timeout: float = 600) -> int:
    """Start `command`, SIGKILL it as soon as `parts` holds a finished block (its .json);
    returns the number of finished blocks then."""
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    try:
        while not glob.glob(os.path.join(parts, "block*.json")):
            assert process.poll() is None, process.stderr.read().decode()
            assert time.time() < deadline, "no block was finished in time"
            time.sleep(0.002)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
        process.stderr.close()
    return len(glob.glob(os.path.join(parts, "block*.json")))


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A tiny model, a bitext of 2,000 lines, its uninterrupted alignment (ref.txt) and the
    parts folder left by the same `align extract` killed after its first finished block."""
    tmp = tmp_path_factory.mktemp("blocks")
    model, _, _ = make_model_dir(tmp)
    sources, targets, _ = monotone_corpus(LINES, seed=2)
    src, tgt, _ = write_corpus(tmp, "corpus", sources, targets)
    common = [model, "-s", src, "-t", tgt, "--block-lines", BLOCK, "--device", "cpu"]
    with restored_aligner_logger():
        run("extract", *common, "-o", tmp / "ref.txt", "-q")
    out = tmp / "out.txt"
    parts = str(out) + C.PARTS_SUFFIX
    finished = _kill_when_a_block_is_finished(
        [*ALIGN, "extract", *map(str, common), "-o", str(out), "-q"], parts)
    assert 1 <= finished < LINES // BLOCK and not out.exists()
    shutil.copytree(parts, tmp / "snapshot.parts")
    shutil.rmtree(parts)
    return dict(tmp=tmp, model=model, src=src, tgt=tgt, common=common, finished=finished,
                ref=(tmp / "ref.txt").read_text())


def _cut_off(killed, tmp_path):
    """-o OUTPUT in tmp_path with the killed run's parts folder beside it."""
    out = tmp_path / "out.txt"
    shutil.copytree(killed["tmp"] / "snapshot.parts", str(out) + C.PARTS_SUFFIX)
    return out


def test_extract_killed_resumes_from_its_first_unfinished_block(killed, tmp_path):
    out = _cut_off(killed, tmp_path)
    with restored_aligner_logger():
        result = run("extract", *killed["common"], "-o", out, "--resume")
    assert out.read_text() == killed["ref"]                    # byte for byte
    assert not os.path.exists(str(out) + C.PARTS_SUFFIX)       # the parts are removed
    n_blocks = LINES // BLOCK
    assert f"{killed['finished']} of {n_blocks} blocks are finished" in result.stderr
    # one bar over the input lines, starting at the finished blocks' lines
    bars = result.stderr.replace("\r", "\n").splitlines()
    assert any(line.startswith("align:") and f"{LINES}/{LINES}" in line for line in bars)
    assert any(f"{killed['finished'] * BLOCK}/{LINES}" in line for line in bars)


def test_extract_refuses_parts_of_another_run_in_one_line(killed, tmp_path):
    out = _cut_off(killed, tmp_path)
    parts = str(out) + C.PARTS_SUFFIX
    before = sorted(os.listdir(parts))
    common = [*killed["common"], "-o", out, "-q"]
    # without --resume: continue it or start anew
    assert "--resume" in error_line(run("extract", *common, ok=False))
    # another method, block size, input, model
    line = error_line(run("extract", *common, "--resume", "-m", "attention-avg", ok=False))
    assert "cannot resume" in line and "method" in line
    line = error_line(run("extract", *common, "--resume", "--block-lines", BLOCK + 1, ok=False))
    assert "block_lines" in line
    line = error_line(run("extract", *common, "--resume", "--subword-pooling", "mean", ok=False))
    assert "subword pooling" in line
    other_tgt = tmp_path / "other.tgt"
    other_tgt.write_text(killed["tgt"].read_text().replace("t1", "t2"))
    changed = [a if a != killed["tgt"] else other_tgt for a in common]
    assert "input" in error_line(run("extract", *changed, "--resume", ok=False))
    other_model, _, _ = make_model_dir(tmp_path, max_positions=20)   # other weights
    changed = [a if a != killed["model"] else other_model for a in common]
    assert "model" in error_line(run("extract", *changed, "--resume", ok=False))
    assert sorted(os.listdir(parts)) == before and not out.exists()   # nothing touched
    # --overwrite: the parts are removed and the alignment starts anew
    run("extract", *common, "--overwrite")
    assert out.read_text() == killed["ref"] and not os.path.exists(parts)


def test_a_parts_folder_not_ours_is_never_removed(killed, tmp_path):
    out = tmp_path / "out.txt"
    parts = tmp_path / ("out.txt" + C.PARTS_SUFFIX)
    parts.mkdir()
    (parts / "mine.txt").write_text("keep\n")
    for flag in ("--overwrite", "--resume"):
        line = error_line(run("extract", *killed["common"], "-o", out, "-q", flag, ok=False))
        assert "not a parts folder of align" in line
    assert (parts / "mine.txt").read_text() == "keep\n" and not out.exists()


def test_resume_needs_an_output_file(killed):
    line = error_line(run("extract", *killed["common"], "-o", "-", "--resume", ok=False))
    assert "--resume" in line and "-o FILE" in line


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_torchrun_extract_shares_the_blocks_and_writes_the_one_process_output(killed,
                                                                              tmp_path):
    """Two gloo processes (torch.distributed.run, as `torchrun --nproc_per_node 2`): block i
    on rank i % 2, rank 0 writes the file, equal byte for byte to one process's (the same
    blocks and batches on the same CPU: no sum is taken in another order)."""
    out = tmp_path / "dist.txt"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
               "-m", "aligner", "extract", *map(str, killed["common"]), "-o", str(out)]
    result = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert out.read_text() == killed["ref"]
    assert sorted(os.listdir(tmp_path)) == ["dist.txt"]          # the parts are removed
    # one bar (rank 0's) over all the input lines
    bars = [line for line in result.stderr.replace("\r", "\n").splitlines()
            if f"/{LINES}" in line]
    assert bars and all(line.startswith("align:") for line in bars)
    assert any(f"{LINES}/{LINES}" in line for line in bars)
    assert result.stderr.count("aligned 2000 sentence pairs") == 1   # rank 0 logs


RUN = ["--max-updates", "2", "-M", "d_model=16", "-M", "n_heads=2", "-M", "enc_layers=1",
       "-M", "dec_layers=1", "-M", "d_ff=32", "-M", "max_positions=12", "-M",
       "lexicon_sample=0", "--bpe-merges", "0", "--threads", "1", "--device", "cpu",
       "--block-lines", BLOCK, "-q"]


@pytest.fixture(scope="module")
def run_corpus(tmp_path_factory):
    """600 lines and their uninterrupted `align run --rounds 2` (-o, -f, -r)."""
    tmp = tmp_path_factory.mktemp("run-blocks")
    sources, targets, _ = monotone_corpus(600, seed=4)
    src, tgt, _ = write_corpus(tmp, "corpus", sources, targets)
    outputs = {name: tmp / f"ref.{name}" for name in ("out", "fwd", "rev")}
    with restored_aligner_logger():
        run("run", "-s", src, "-t", tgt, "--rounds", 2, "--model-dir", tmp / "ref-model",
            "-o", outputs["out"], "-f", outputs["fwd"], "-r", outputs["rev"], *RUN)
    return dict(tmp=tmp, src=src, tgt=tgt,
                ref={name: path.read_text() for name, path in outputs.items()},
                guide=(tmp / "ref-model" / "rounds" / "1" / "links.align").read_text())


@pytest.mark.parametrize("cut_in", ["guide", "final"])
def test_run_killed_in_an_alignment_resumes_from_its_blocks(run_corpus, tmp_path, cut_in):
    """SIGKILL while round 1's guide or the final alignment is aligned (a block finished):
    align run --resume goes on from the first unfinished block; the guide and outputs equal
    the uninterrupted run's byte for byte and the parts folders are gone."""
    model = tmp_path / "model"
    outputs = {name: tmp_path / f"out.{name}" for name in ("out", "fwd", "rev")}
    command = ["run", "-s", run_corpus["src"], "-t", run_corpus["tgt"], "--rounds", 2,
               "--model-dir", model, "-o", outputs["out"], "-f", outputs["fwd"],
               "-r", outputs["rev"], *RUN]
    parts = (str(model / "rounds" / "1" / "links.align") + C.PARTS_SUFFIX if cut_in == "guide"
             else str(model / C.ALIGNMENT_PARTS))
    finished = _kill_when_a_block_is_finished([*ALIGN, *map(str, command)], parts)
    assert finished < 600 // BLOCK and not outputs["out"].exists()
    with restored_aligner_logger():
        result = run(*[a for a in command if a != "-q"], "--resume")
    assert "blocks are finished: going on with the others" in result.stderr
    assert (model / "rounds" / "1" / "links.align").read_text() == run_corpus["guide"]
    for name, path in outputs.items():
        assert path.read_text() == run_corpus["ref"][name], name
    assert not [name for name in os.listdir(model) if name.endswith(C.PARTS_SUFFIX)]


def _align_bitext_worker(rank: int, world_size: int, port: int, model: str, src: str,
                         tgt: str, out: str) -> None:
    """One rank of a torchrun-like group calling align_bitext, as a stage of a run does."""
    import torch

    from aligner.distributed import init_distributed, shutdown_distributed
    from aligner.extract.corpus_alignment import Extraction, align_bitext
    from aligner.formats import open_bitext

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    context = init_distributed("cpu")
    extraction = Extraction.load(model, torch.device("cpu"), "hmm-posterior", "soft-average",
                                 0.55)
    _, _, links = align_bitext(extraction, open_bitext(src, tgt),
                               {"soft-average": out, "fwd": out + ".fwd"}, quiet=True,
                               parts=out + C.PARTS_SUFFIX, block_lines=BLOCK)
    assert (links > 0) == (rank == 0)             # rank 0 reports, the others return nothing
    assert os.path.isfile(out) and not os.path.exists(out + C.PARTS_SUFFIX)
    shutdown_distributed(context)


def test_align_bitext_under_a_process_group_shards_blocks_and_rank_0_writes(run_corpus,
                                                                          tmp_path):
    """align_bitext (align run's final alignment, a self-training guide) called by the 2
    ranks of a gloo group: the files of one process, byte for byte."""
    import torch
    import torch.multiprocessing as mp

    from aligner.extract.corpus_alignment import Extraction, align_bitext
    from aligner.formats import open_bitext

    model = str(run_corpus["tmp"] / "ref-model")
    src, tgt = str(run_corpus["src"]), str(run_corpus["tgt"])
    ref = str(tmp_path / "ref.txt")
    align_bitext(Extraction.load(model, torch.device("cpu"), "hmm-posterior", "soft-average",
                                 0.55), open_bitext(src, tgt),
                 {"soft-average": ref, "fwd": ref + ".fwd"},
                 quiet=True, parts=ref + C.PARTS_SUFFIX, block_lines=BLOCK)
    out = str(tmp_path / "dist.txt")
    mp.spawn(_align_bitext_worker, args=(2, _free_port(), model, src, tgt, out), nprocs=2,
             join=True)
    for suffix in ("", ".fwd"):
        assert open(out + suffix).read() == open(ref + suffix).read()
    assert sorted(os.listdir(tmp_path)) == ["dist.txt", "dist.txt.fwd", "ref.txt",
                                            "ref.txt.fwd"]


def test_torchrun_align_run_trains_the_rounds_and_shards_the_final_alignment(run_corpus,
                                                                              tmp_path):
    """`torchrun --nproc_per_node 2 -m aligner run` (2 gloo processes): the rounds train
    through DDP (other weights than one process's: each rank takes half of each update's
    batches), the guide and the final alignment are sharded by block, and rank 0 writes one
    output of one line per input line that equals the model's own one-process extraction."""
    model, out = tmp_path / "model", tmp_path / "dist.align"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
               "-m", "aligner", "run", "-s", str(run_corpus["src"]), "-t",
               str(run_corpus["tgt"]), "--rounds", "2", "--model-dir", str(model), "-o",
               str(out), *map(str, RUN)]
    result = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(out.read_text().splitlines()) == 600
    assert len((model / "rounds" / "1" / "links.align").read_text().splitlines()) == 600
    assert not (model / C.ALIGNMENT_PARTS).exists()
    record = json.loads((model / "run.json").read_text())
    assert {session["processes"] for session in record["sessions"]} == {2}
    with restored_aligner_logger():
        run("extract", model, "-s", run_corpus["src"], "-t", run_corpus["tgt"], "-o",
            tmp_path / "one.align", "--block-lines", BLOCK, "-q")
    assert out.read_text() == (tmp_path / "one.align").read_text()


def test_align_run_under_torchrun_needs_a_model_dir(run_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    line = error_line(run("run", "-s", run_corpus["src"], "-t", run_corpus["tgt"], "-o",
                          tmp_path / "x.align", *RUN, ok=False))
    assert "under torchrun give --model-dir" in line


def test_a_second_extract_on_the_same_output_is_refused_while_the_first_writes(killed,
                                                                              tmp_path):
    """`align extract A ... -o dup & align extract B ... -o dup --overwrite`: the second is
    refused in one line naming the first's pid (the parts folder is locked, as a model
    directory is), and the first writes its own alignment, every block its own model's."""
    out = tmp_path / "dup.txt"
    parts = str(out) + C.PARTS_SUFFIX
    first = subprocess.Popen([*ALIGN, "extract", *map(str, killed["common"]), "-o", str(out),
                              "-q"], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 600
        while not glob.glob(os.path.join(parts, "block*.json")):
            assert first.poll() is None, first.stderr.read().decode()
            assert time.time() < deadline, "no block was finished in time"
            time.sleep(0.002)
        os.kill(first.pid, signal.SIGSTOP)     # held mid-run while the second one tries
        other_model, _, _ = make_model_dir(tmp_path, max_positions=20)   # other weights
        common = [a if a != killed["model"] else other_model for a in killed["common"]]
        second = subprocess.run([*ALIGN, "extract", *map(str, common), "-o", str(out),
                                 "--overwrite", "-q"], env=ENV, capture_output=True,
                                text=True, timeout=600)
        os.kill(first.pid, signal.SIGCONT)
        assert second.returncode == 1
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("align: error: "), second.stderr
        assert f"another align process (pid {first.pid} on host" in lines[0]
        assert first.wait(timeout=600) == 0, first.stderr.read().decode()
    finally:
        first.kill()
        first.wait()
        first.stderr.close()
    assert out.read_text() == killed["ref"] and not os.path.exists(parts)
