"""Resume across device counts (aligner/training/loop.py): a checkpoint holds one CUDA RNG state per
GPU visible when it was saved; a resume on another number of GPUs, or on the CPU, must work.
And a CPU run never initializes CUDA for its RNG states."""
from __future__ import annotations

import logging

import torch

from aligner import constants as C
from aligner.model_dir import load_checkpoint_file, save_checkpoint_file
from aligner.training.loop import Trainer, restorable_cuda_states
from test_train import CPU, config, make_data, make_model


def test_restorable_cuda_states_fit_the_visible_gpus():
    saved = [torch.full((8,), k, dtype=torch.uint8) for k in range(4)]
    assert [int(s[0]) for s in restorable_cuda_states(saved, 2)] == [0, 1]   # fewer GPUs now
    assert [int(s[0]) for s in restorable_cuda_states(saved, 8)] == [0, 1, 2, 3]  # more
    assert restorable_cuda_states(saved, 0) == []


def test_checkpoint_with_cuda_states_of_other_gpus_resumes_on_cpu(tmp_path, caplog,
                                                                  monkeypatch):
    """A training state saved where 3 GPUs were visible (fake CUDA RNG states) resumes on the
    CPU through Trainer.run(resume=True), bit-identical to a run without them; the states are
    reported as not restored, and CUDA is not asked for anything."""
    def no_cuda(*args, **kwargs):
        raise AssertionError("a CPU run asked CUDA for its RNG states")

    for name in ("get_rng_state_all", "set_rng_state_all", "set_rng_state", "get_rng_state"):
        monkeypatch.setattr(torch.cuda, name, no_cuda)
    corpus, _, src_vocab, tgt_vocab, _ = make_data(tmp_path)
    vocabs = (src_vocab, tgt_vocab)
    finals = {}
    for name, fake_states in (("plain", None), ("three_gpus", 3)):
        folder = tmp_path / name
        Trainer(make_model(vocabs), corpus, "fwd", config(max_updates=3, checkpoint_interval=3),
                str(folder), CPU, progress=False).run()
        if fake_states:
            path = folder / C.TRAINING_STATE
            state = load_checkpoint_file(str(path))
            assert "cuda" not in state["rng"]            # saved on the CPU: no CUDA states
            state["rng"]["cuda"] = [torch.zeros(16, dtype=torch.uint8)] * fake_states
            save_checkpoint_file(state, str(path))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="aligner"):
            summary = Trainer(make_model(vocabs, seed=99), corpus, "fwd",
                              config(max_updates=6, checkpoint_interval=3), str(folder), CPU,
                              progress=False).run(resume=True)
        assert summary.updates == 6
        finals[name] = torch.load(folder / C.PARAMS_LAST, weights_only=True)["state_dict"]
        if fake_states:
            assert "3 saved CUDA RNG state(s) not restored: training on cpu" in caplog.text
    assert all(torch.equal(finals["plain"][k], finals["three_gpus"][k]) for k in finals["plain"])
