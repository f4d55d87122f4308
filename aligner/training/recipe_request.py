"""The recipe's training request: what `align run` trains, and the alignment layer's stage 0.

One builder, :func:`recipe_request`, turns the recipe of aligner/training/recipe.py (hmm1,
its model options, batches, learning rate, length cap) plus the settings a user may change
into a :class:`~aligner.training.run.TrainRequest` of both directions; the caller gives the
preprocessing (the recipe's BPE merges are ``recipe.bpe_merges(len(bitext))``). `align run`
calls it with its options (aligner/cli/run.py); the guided alignment layer's stage 0 with no
recipe setting of its own, only the layer run's device, precision, determinism, seed,
tokenization, resume / overwrite and logging (aligner/training/recipe_guide.py), so both
train the same recipe the same way.

The settings that depend on the device (:func:`device_defaults`: batches, learning rate,
warm-up, the direct HMM's chunk budget) are the device's, or, for a resumed run, the run's
own. `align train` resolves them with the same functions.
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

from aligner import constants as C
from aligner.training import recipe

if TYPE_CHECKING:  # pragma: no cover
    from aligner.formats import Bitext
    from aligner.prep import PrepConfig
    from aligner.training.run import TrainRequest


def device_defaults(device_type: str, model_dir: Optional[str], resume: bool
                    ) -> Dict[str, Any]:
    """max_tokens, lr, warmup and chunk_floats for the options the user left out:
    :func:`aligner.training.recipe.device_defaults` of the device type ("cpu", "cuda"); with
    `resume` of a run whose config.json is there (MODEL_DIR's, or, for a self-training run
    cut off before its last round, round 1's: every round trains with its batches), the
    run's own values (a run resumed on another device goes on with its batches: the batcher
    refuses another max_tokens, and the settings check another lr), chunk_floats None when
    its models were given none. A config.json that cannot be read leaves the device's values
    (the run's own checks report it)."""
    values: Dict[str, Any] = recipe.device_defaults(device_type)
    if not (resume and model_dir):
        return values
    path = next((path for path in (os.path.join(model_dir, C.CONFIG_NAME),
                                   os.path.join(model_dir, C.ROUNDS_DIR, "1", C.CONFIG_NAME))
                 if os.path.isfile(path)), None)
    if path is None:
        return values
    try:
        with open(path, encoding="utf-8") as handle:
            saved = json.load(handle)
        training, models = saved["training"], saved["models"]
        values.update({key: training[key] for key in ("max_tokens", "lr", "warmup")
                       if key in training})
        chunks = [m["chunk_floats"] for m in models.values() if "chunk_floats" in m]
        values["chunk_floats"] = chunks[0] if chunks else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return values


def training_settings(by_device: Dict[str, Any], max_tokens: Optional[int], lr: Optional[float],
                      warmup: Optional[int], resume: bool) -> Dict[str, Any]:
    """max_tokens, lr and warmup of a training: each the user's where given, else the device's
    (`by_device`: :func:`device_defaults`). The device's warm-up goes with its batches: a
    --max-tokens of the user's without --warmup takes TRAINING's warm-up (not on --resume,
    where `by_device` holds the run's own)."""
    if warmup is None:
        warmup = (by_device["warmup"] if max_tokens is None or resume
                  else recipe.TRAINING["warmup"])
    return dict(max_tokens=by_device["max_tokens"] if max_tokens is None else max_tokens,
                lr=by_device["lr"] if lr is None else lr, warmup=warmup)


def device_chunk_floats(model_options: Dict[str, Any], fields: Any,
                        chunk_floats: Optional[int]) -> None:
    """Give the direct HMM's chunk_floats (:func:`device_defaults`) to `model_options` when the
    model kind has the setting (`fields`: its config's fields), -M did not give it and it is
    not the model's own default (a CPU run's config.json stays as it was)."""
    if ("chunk_floats" in fields and "chunk_floats" not in model_options
            and chunk_floats is not None and chunk_floats != recipe.CPU_CHUNK_FLOATS):
        model_options["chunk_floats"] = chunk_floats


def recipe_request(model_dir: str, bitext: "Bitext", prep_config: "PrepConfig", *,
                   device: str = "auto", precision: str = "auto", deterministic: bool = False,
                   seed: int = 1, resume: bool = False, overwrite: bool = False,
                   model_options: Optional[Dict[str, Any]] = None,
                   max_tokens: Optional[int] = None, lr: Optional[float] = None,
                   warmup: Optional[int] = None, epochs: int = recipe.EPOCHS_PER_ROUND,
                   max_updates: int = 0, max_len: Optional[int] = None, guide: str = "",
                   guide_weight: float = 0.0,
                   agreement_weight: float = recipe.AGREEMENT_WEIGHT,
                   heuristic: str = recipe.HEURISTIC, threshold: float = recipe.THRESHOLD,
                   quiet: bool = False, verbose: bool = False, argv: Sequence[str] = (),
                   ignore_data_change: bool = False) -> "TrainRequest":
    """Round 1's request of the recipe on `bitext` into `model_dir`, both directions.

    prep_config: tokenization, lowercasing and BPE merges (the caller's:
    ``recipe.bpe_merges(len(bitext))`` unless a user gave them). model_options: -M settings
    over ``recipe.MODEL_OPTIONS``. max_tokens / lr / warmup: None = the device's, or a
    resumed run's own (:func:`device_defaults`). epochs / max_updates: a round's length (0
    updates = epochs decide). max_len: the training length cap, None = the recipe's within
    what the model takes (a user's value is checked by aligner/cli/options.resolve_max_len).
    guide / guide_weight: round 1's --guide and its resolved weight. heuristic / threshold:
    the output's, recorded for `align extract`. The directions train side by side where
    that is faster (aligner/training/directions.py)."""
    from aligner.config import CHECKPOINT_AT_THE_END, DataConfig, TrainConfig
    from aligner.distributed import resolve_device
    from aligner.models import model_class
    from aligner.training.directions import default_parallel_directions
    from aligner.training.run import TrainRequest

    options: Dict[str, Any] = {**recipe.MODEL_OPTIONS, **(model_options or {})}
    torch_device = resolve_device(device)
    by_device = device_defaults(torch_device.type, model_dir, resume)
    device_chunk_floats(options, model_class(recipe.MODEL_KIND).config_class
                        .__dataclass_fields__, by_device["chunk_floats"])
    train_config = TrainConfig(**{**recipe.TRAINING,
                                  **training_settings(by_device, max_tokens, lr, warmup,
                                                      resume)},
                               max_epochs=0 if max_updates else epochs,
                               max_updates=max_updates,
                               checkpoint_interval=CHECKPOINT_AT_THE_END, device=device,
                               precision=precision, deterministic=deterministic, seed=seed,
                               guide_weight=guide_weight, agreement_weight=agreement_weight)
    # longer pairs are skipped in training; every line is aligned
    train_max_len = (min(recipe.TRAIN_MAX_LEN, int(options["max_positions"]) - 1)
                     if max_len is None else max_len)
    return TrainRequest(
        model_dir, bitext, recipe.MODEL_KIND, options, prep_config,
        DataConfig(max_len=train_max_len, guide=guide), train_config,
        directions=C.DIRECTIONS, resume=resume, overwrite=overwrite, quiet=quiet,
        verbose=verbose, argv=argv, ignore_data_change=ignore_data_change,
        # apart, the directions train faster side by side; agreement trains them in one loop
        parallel_directions=default_parallel_directions(torch_device, C.DIRECTIONS,
                                                        agreement_weight, len(bitext)),
        # the model's align extract defaults: the output's
        extra={C.ALIGN_RUN_SETTINGS: {"symmetrize": heuristic, "threshold": threshold}})
