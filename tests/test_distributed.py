"""torchrun without a GPU: the rank -> device mapping, the process group's timeout and one
process group for both stages of a two-stage kind (aligner/distributed.py).

The workers run as torchrun would start them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR/PORT in the environment), two gloo processes on the CPU. CUDA devices are mapped
through :func:`aligner.distributed.device_for_rank`, the pure function that
:func:`~aligner.distributed.resolve_device` feeds with this machine's CUDA answers.
"""
from __future__ import annotations

import datetime
import json
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from aligner.config import DataConfig
from aligner.distributed import (DEFAULT_TIMEOUT_S, TIMEOUT_ENV, device_for_rank,
                                 init_distributed, process_group_timeout, resolve_device,
                                 shutdown_distributed)
from aligner.formats import Bitext
from aligner.prep import PrepConfig
from aligner.training.recipe_guide import train_layer
from aligner.training.request import TrainRequest
from aligner.utils import AlignerError
from synthetic import monotone_corpus
from test_ddp import MODEL, _config, _free_port


def _environment(rank: int, world_size: int, port: int) -> None:
    """What torchrun sets for every worker (one node)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)


# -- the rank -> device mapping ------------------------------------------------------------------

@pytest.mark.parametrize("name, local_rank, expected", [
    ("cuda", 0, "cuda:0"), ("cuda", 1, "cuda:1"), ("auto", 1, "cuda:1"),
    ("cuda:1", 0, "cuda:1"), ("cuda:1", 1, "cuda:2"), ("cpu", 1, "cpu"),
])
def test_each_local_rank_gets_its_own_gpu(name, local_rank, expected):
    device = device_for_rank(name, local_rank, 2, cuda_available=True, device_count=4)
    assert device == torch.device(expected)


def test_one_process_keeps_the_gpu_it_names():
    assert device_for_rank("cuda:3", cuda_available=True, device_count=4) == torch.device(
        "cuda", 3)
    assert device_for_rank("auto", cuda_available=False, device_count=0) == torch.device("cpu")


@pytest.mark.parametrize("name, local_world_size, count, message", [
    ("cuda:3", 2, 4, "2 processes per node need GPUs 3 to 4, only 4 CUDA device(s)"),
    ("cuda", 4, 2, "4 processes per node need GPUs 0 to 3, only 2 CUDA device(s)"),
    ("cuda:2", 1, 2, "--device cuda:2: only 2 CUDA device(s)"),
    ("cuda:1", 1, 2, "--device cuda:1: 2 processes per node need GPUs 1 to 2"),  # rank 1
    ("cuda:x", 1, 2, "--device must be auto, cpu, cuda or cuda:N (got 'cuda:x')"),
    ("gpu", 1, 2, "--device must be auto, cpu, cuda or cuda:N (got 'gpu')"),
])
def test_gpus_the_node_lacks_are_one_line_errors(name, local_world_size, count, message):
    """(local rank 1 with cuda:1: a launcher that sets no LOCAL_WORLD_SIZE.)"""
    local_rank = 1 if name == "cuda:1" else 0
    with pytest.raises(AlignerError, match="^[^\n]*$") as error:
        device_for_rank(name, local_rank, local_world_size, cuda_available=True,
                        device_count=count)
    assert message in str(error.value)


def test_cuda_without_cuda_is_one_line():
    with pytest.raises(AlignerError, match="CUDA is not available"):
        device_for_rank("cuda", cuda_available=False, device_count=0)
    if not torch.cuda.is_available():
        with pytest.raises(AlignerError, match="CUDA is not available"):
            resolve_device("cuda:1")


def _mapping_worker(rank: int, world_size: int, port: int, workdir: str) -> None:
    _environment(rank, world_size, port)
    context = init_distributed("cpu")
    device = device_for_rank("cuda:1", context.local_rank, context.local_world_size,
                             cuda_available=True, device_count=4)
    devices = [None] * world_size
    dist.all_gather_object(devices, str(device))
    if context.is_main:
        with open(os.path.join(workdir, "devices.json"), "w") as out:
            json.dump(devices, out)
    shutdown_distributed(context)


def test_torchrun_ranks_map_cuda_1_to_gpus_1_and_2(tmp_path):
    mp.spawn(_mapping_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    assert json.loads((tmp_path / "devices.json").read_text()) == ["cuda:1", "cuda:2"]


# -- the timeout of the process group -------------------------------------------------------------

def test_timeout_default_and_environment(monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert process_group_timeout() == datetime.timedelta(seconds=DEFAULT_TIMEOUT_S)
    assert DEFAULT_TIMEOUT_S > 30 * 60    # above gloo's default and NCCL's watchdog
    monkeypatch.setenv(TIMEOUT_ENV, "90")
    assert process_group_timeout() == datetime.timedelta(seconds=90)
    for bad in ("0", "-5", "soon"):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(AlignerError, match=f"{TIMEOUT_ENV}={bad}: must be a positive"):
            process_group_timeout()


#: long enough for the ranks to connect on a loaded machine (the store's connection waits
#: for the same timeout), far below gloo's own default of 30 minutes
SHORT_TIMEOUT_S = 10
#: rank 0 stays busy until rank 1 has given up, or this long
RANK0_BUSY_S = 120


def _timeout_worker(rank: int, world_size: int, port: int, workdir: str) -> None:
    """Rank 0 is busy (as when it prepares the corpus) and never reaches the barrier; rank 1
    waits in it and records how long until the process group's timeout ended the wait."""
    _environment(rank, world_size, port)
    os.environ[TIMEOUT_ENV] = str(SHORT_TIMEOUT_S)
    context = init_distributed("cpu")
    if rank == 0:
        deadline = time.time() + RANK0_BUSY_S
        while not os.path.exists(os.path.join(workdir, "rank1.json")) and time.time() < deadline:
            time.sleep(0.1)
        return
    start = time.time()
    try:
        context.barrier()
        outcome = "passed"
    except Exception as error:  # gloo's timeout: RuntimeError / DistBackendError
        outcome = type(error).__name__ + ": " + str(error).splitlines()[0]
    with open(os.path.join(workdir, "rank1.tmp"), "w") as out:
        json.dump({"outcome": outcome, "waited": time.time() - start}, out)
    os.replace(os.path.join(workdir, "rank1.tmp"), os.path.join(workdir, "rank1.json"))


def test_the_timeout_reaches_the_waiting_ranks(tmp_path):
    """With ALIGNER_DIST_TIMEOUT=10 the waiting rank gives up after about 10 s (gloo's own
    default would wait 30 minutes): the timeout is the one the process group was made with."""
    mp.spawn(_timeout_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    result = json.loads((tmp_path / "rank1.json").read_text())
    assert result["outcome"] != "passed"
    assert SHORT_TIMEOUT_S - 0.5 <= result["waited"] < SHORT_TIMEOUT_S + 30, result


# -- one process group for both stages of the alignment layer ------------------------------------

def _count_group_calls() -> dict:
    """In this worker process, count torch.distributed's public init_process_group and
    destroy_process_group calls; returns the counts ({"init": n, "destroy": n}), kept up to
    date."""
    calls = {"init": 0, "destroy": 0}
    init, destroy = dist.init_process_group, dist.destroy_process_group

    def counted_init(*args, **kwargs):
        calls["init"] += 1
        return init(*args, **kwargs)

    def counted_destroy(*args, **kwargs):
        calls["destroy"] += 1
        return destroy(*args, **kwargs)

    dist.init_process_group, dist.destroy_process_group = counted_init, counted_destroy
    return calls


def _two_stage_worker(rank: int, world_size: int, port: int, workdir: str) -> None:
    """Train the alignment layer (stage 1: its transformer base) with torch.distributed's
    public init/destroy counted."""
    _environment(rank, world_size, port)
    calls = _count_group_calls()
    sources, targets, _ = monotone_corpus(40, seed=7)
    train_layer(TrainRequest(os.path.join(workdir, "model"), Bitext(sources, targets, "s", "t"),
                             "alignment-layer", dict(MODEL), PrepConfig(bpe_merges=10),
                             DataConfig(), _config(max_updates=2), directions=("fwd",),
                             quiet=True))
    with open(os.path.join(workdir, f"calls{rank}.json"), "w") as out:
        json.dump(calls, out)


def test_two_stages_share_one_process_group(tmp_path):
    mp.spawn(_two_stage_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        assert json.loads((tmp_path / f"calls{rank}.json").read_text()) == {"init": 1,
                                                                          "destroy": 1}
    assert (tmp_path / "model" / "base" / "fwd" / "params.best.pt").exists()
    assert (tmp_path / "model" / "fwd" / "params.best.pt").exists()


def _three_stage_worker(rank: int, world_size: int, port: int, workdir: str) -> None:
    """Train the alignment layer without a guide (stage 0: the recipe and its links of the
    bitext, aligner/training/recipe_guide.py) with torch.distributed's public init/destroy
    counted."""
    _environment(rank, world_size, port)
    calls = _count_group_calls()
    # (the recipe's 1,200-token batches: 2+ per epoch for 2 ranks)
    sources, targets, _ = monotone_corpus(400, seed=7)
    train_layer(TrainRequest(os.path.join(workdir, "model"), Bitext(sources, targets, "s", "t"),
                             "alignment-layer", dict(MODEL, layer_query="target"),
                             PrepConfig(bpe_merges=10), DataConfig(),
                             _config(max_updates=2, guide_weight=10.0), quiet=True,
                             recipe_guide=True))
    with open(os.path.join(workdir, f"calls{rank}.json"), "w") as out:
        json.dump(calls, out)


def test_the_layers_recipe_guide_runs_under_torchrun(tmp_path):
    """Stage 0 under torchrun: both ranks train the recipe's rounds and align the bitext
    (sharded, rank 0 writes the links) in the one process group of the three stages."""
    mp.spawn(_three_stage_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        assert json.loads((tmp_path / f"calls{rank}.json").read_text()) == {"init": 1,
                                                                          "destroy": 1}
    model = tmp_path / "model"
    links = (model / "guide" / "links.align").read_text().splitlines()
    assert len(links) == 400 and any(links)
    record = json.loads((model / "guide" / "run.json").read_text())
    assert {session["processes"] for session in record["sessions"]} == {2}
    config = json.loads((model / "config.json").read_text())
    assert config["data"]["guide"] == str(model / "guide" / "links.align")
    assert (model / "base" / "fwd" / "params.best.pt").exists()
    assert not [p for p in model.rglob("*.tmp")]


# -- self-training rounds under torchrun ----------------------------------------------------------

def _rounds_worker(rank: int, world_size: int, port: int, workdir: str) -> None:
    """Two self-training rounds of the direct HMM on 2 ranks, torch.distributed's public
    init/destroy counted."""
    from aligner.training.request import SelfTraining
    from aligner.training.rounds import train_rounds

    _environment(rank, world_size, port)
    calls = _count_group_calls()
    sources, targets, _ = monotone_corpus(40, seed=7)
    request = TrainRequest(os.path.join(workdir, "model"), Bitext(sources, targets, "s", "t"),
                           "hmm1", dict(MODEL), PrepConfig(bpe_merges=10), DataConfig(),
                           _config(max_updates=2), quiet=True)
    train_rounds(request, SelfTraining(rounds=2, round_pairs=30))
    with open(os.path.join(workdir, f"calls{rank}.json"), "w") as out:
        json.dump(calls, out)


def test_self_training_rounds_run_under_torchrun(tmp_path):
    """The recipe's rounds are not refused under torchrun: the teacher's links guide round 1,
    both ranks train every round in one process group, round 1's model aligns round 2's
    sample (its guide, one line per sampled pair, written once) and the model directory ends
    as round 2's run of 2 processes."""
    mp.spawn(_rounds_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        assert json.loads((tmp_path / f"calls{rank}.json").read_text()) == {"init": 1,
                                                                          "destroy": 1}
    model = tmp_path / "model"
    guide = (model / "rounds" / "1" / "links.align").read_text().splitlines()
    assert len(guide) == 30 and any(guide)
    assert sorted(p.name for p in model.iterdir() if p.name.endswith(".tmp")) == []
    assert (model / "rounds" / "2" / "done").exists()
    config = json.loads((model / "config.json").read_text())
    assert config["extra"]["self_training"] == {"round": 2}
    record = json.loads((model / "run.json").read_text())
    assert [stage["stage"] for stage in record["stages"]].count("guide") == 1
    assert {session["processes"] for session in record["sessions"]} == {2}
    # round 1 is guided by the teacher, run once (on rank 0) for round 1's 30 lines
    assert [stage["stage"] for stage in record["stages"]].count("teacher") == 1
    assert len((model / "rounds" / "0" / "links.align").read_text().splitlines()) == 30
