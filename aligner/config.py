"""Configuration objects of a training run, saved together as the model directory's config.json.

* :class:`DataConfig`  — length filtering of the training pairs.
* :class:`TrainConfig` — optimizer, schedule, batching, checkpoints, validation, device, seed.
* :class:`RunConfig`   — everything in ``config.json``: format and package versions, model kind,
  the model config per direction, the preprocessing config, data and training configs.

The model configs (e.g. :class:`aligner.models.transformer.TransformerConfig`) and the
preprocessing config (:class:`aligner.prep.PrepConfig`) live next to their code; here they are
kept as plain dicts so this module needs neither torch nor the model classes. No torch here.
"""
from __future__ import annotations

import dataclasses
import json
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Type, TypeVar

from aligner import __version__
from aligner import constants as C
from aligner.training import recipe
from aligner.utils import AlignerError, atomic_output, check_condition

T = TypeVar("T")


def dataclass_from_dict(cls: Type[T], values: Dict[str, Any], what: str = "") -> T:
    """Dataclass `cls` from a dict (e.g. read from JSON), checked before it is built: unknown
    keys are refused (a typo must not pass silently) and every value must have its field's
    type (:func:`check_field_types`). Errors are AlignerErrors prefixed with "`what`: "."""
    prefix = f"{what}: " if what else ""
    check_condition(isinstance(values, dict), f"{prefix}expected a JSON object")
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - known)
    check_condition(not unknown, f"{prefix}unknown keys {', '.join(unknown)}")
    check_field_types(cls, values, what)
    try:
        return cls(**values)  # type: ignore[call-arg]
    except TypeError as error:  # e.g. a field without default missing
        raise AlignerError(f"{prefix}{error}") from None
    except AlignerError as error:  # a range check of __post_init__
        raise AlignerError(f"{prefix}{error}") from None


class ModelConfig:
    """What every model kind's config dataclass shares (aligner/models/): ``to_dict()`` for
    config.json and ``from_dict()``, which refuses unknown keys naming the class (a typo must
    not pass silently) and values of the wrong type (:func:`dataclass_from_dict`).

    ``LEGACY_DEFAULTS``: settings added after model directories were written, with the value
    they had before: a config.json without the key (it records only the options given) is
    read with it, and a new run writes the key (:func:`recorded_options`)."""

    LEGACY_DEFAULTS: Dict[str, Any] = {}

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: Type[T], values: Dict[str, Any]) -> T:
        known = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(values) - known)
        check_condition(not unknown, f"unknown {cls.__name__} keys: {', '.join(unknown)}")
        return dataclass_from_dict(cls, {**cls.LEGACY_DEFAULTS, **values})  # type: ignore

    @classmethod
    def recorded_options(cls, options: Dict[str, Any]) -> Dict[str, Any]:
        """A new run's model options for config.json: `options` and, where not given, the
        current default of every setting in LEGACY_DEFAULTS."""
        defaults = {field.name: field.default for field in dataclasses.fields(cls)  # type: ignore
                    if field.name in cls.LEGACY_DEFAULTS}
        return {**defaults, **options}


def check_field_types(cls: type, values: Dict[str, Any], what: str = "") -> None:
    """AlignerError naming the key unless each value of `values` has the type annotated on the
    dataclass field of that name: ``int`` (not bool), ``float`` (an int or float, not bool),
    ``bool``, ``str``, ``Optional[...]``, ``List``/``Tuple`` (a list or tuple), ``Dict`` (a
    dict); other annotations are not checked. Keys that are not fields are ignored here."""
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        hint = hints.get(key)
        if hint is not None and not _has_type(value, hint):
            raise AlignerError(f"{what + ': ' if what else ''}{key} must be "
                               f"{_type_name(hint)}, not {value!r}")


def _has_type(value: Any, hint: Any) -> bool:
    """Whether a JSON-like `value` fits the annotation `hint` (see check_field_types)."""
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        return any(_has_type(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple) or hint in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return True


_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
               type(None): "null"}


def _type_name(hint: Any) -> str:
    """How an error message names the type `hint` ("an integer", "a string or null")."""
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        return " or ".join(_type_name(arg) for arg in typing.get_args(hint))
    if origin in (list, tuple) or hint in (list, tuple):
        return "a list"
    if origin is dict or hint is dict:
        return "a JSON object"
    return _TYPE_NAMES.get(hint, str(hint))


@dataclass
class DataConfig:
    """Length filtering of training pairs (counted subwords, without BOS/EOS).

    max_len: pairs with a side longer than this are skipped (and counted in the log).
    max_ratio: pairs whose length ratio (longer / shorter side) exceeds this are skipped;
        0 = no ratio filter.
    guide: Pharaoh word alignments of the training bitext, one line per training line
        (``align train --guide``; aligner/training/guidance.py); "" = none.
    """

    max_len: int = recipe.OTHER_KINDS_MAX_LEN
    max_ratio: float = 0.0
    guide: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Dict[str, Any], what: str = "data config") -> "DataConfig":
        return dataclass_from_dict(cls, values, what)


@dataclass
class TrainConfig:
    """Hyper-parameters of the training loop (one direction; both directions share them).

    Batches hold at most `max_tokens` padded tokens (max(source, target) length × sentences);
    one update accumulates the gradients of `update_freq` batches. The learning rate warms up
    linearly over `warmup` updates to `lr`, then decays (`lr_schedule`): "inverse-sqrt" as
    lr · sqrt(warmup / update), or "linear" to lr / (T - max(warmup, 1) + 1) at the run's last
    update T (see aligner.training.loop.learning_rate; such a run resumes only with the same
    max_updates and max_epochs). Training stops after `max_updates` updates or `max_epochs` epochs,
    whichever comes first (0 = no limit; at least one must be set). A checkpoint (validation,
    params.last.pt, training state, and params.best.pt when validation improved) is written every
    `checkpoint_interval` updates and at the end.

    The defaults of batches, learning rate, schedule, label smoothing, clipping and epochs are
    the recipe's (aligner/training/recipe.py: TRAINING, EPOCHS), the values `align train` takes
    on the CPU with --rounds 1 (the commands resolve them: aligner/training/builder.py).
    """

    max_tokens: int = recipe.TRAINING["max_tokens"]
    update_freq: int = 1
    lr: float = recipe.TRAINING["lr"]
    warmup: int = recipe.TRAINING["warmup"]
    #: decay after the warm-up: one of constants.LR_SCHEDULES
    lr_schedule: str = recipe.TRAINING["lr_schedule"]
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    label_smoothing: float = recipe.TRAINING["label_smoothing"]
    clip_norm: float = recipe.TRAINING["clip_norm"]
    max_updates: int = 0
    max_epochs: int = recipe.EPOCHS
    checkpoint_interval: int = 1000
    log_interval: int = 100
    #: extraction method used for validation AER ("" = the model kind's first method)
    valid_method: str = ""
    #: weight λ_g of the guided-alignment cross-entropy (needs DataConfig.guide; 0 = none)
    guide_weight: float = 0.0
    #: weight λ of the agreement term between the two directions' posteriors (aligner/
    #: agreement.py: both directions train together; 0 = each on its own)
    agreement_weight: float = 0.0
    device: str = "auto"
    #: one of constants.PRECISIONS (aligner/precision.py: auto = bf16 autocast on CUDA with
    #: native bfloat16, fp32 elsewhere)
    precision: str = "auto"
    #: torch.use_deterministic_algorithms and CUBLAS_WORKSPACE_CONFIG (aligner.training.loop.
    #: use_deterministic_algorithms): bit-identical GPU runs; the CPU's output is the same
    #: either way
    deterministic: bool = False
    seed: int = C.DEFAULT_SEED

    def __post_init__(self) -> None:
        check_condition(self.max_tokens > 0, "--max-tokens must be positive")
        check_condition(self.update_freq >= 1, "--update-freq must be at least 1")
        check_condition(self.lr > 0, "--lr must be positive")
        check_condition(self.warmup >= 0, "--warmup must be >= 0")
        check_condition(self.lr_schedule in C.LR_SCHEDULES,
                        f"--lr-schedule must be one of {', '.join(C.LR_SCHEDULES)}: "
                        f"{self.lr_schedule}")
        check_condition(0.0 <= self.label_smoothing < 1.0, "--label-smoothing must be in [0, 1)")
        check_condition(self.clip_norm >= 0, "--clip-norm must be >= 0 (0 = no clipping)")
        check_condition(self.max_updates >= 0 and self.max_epochs >= 0,
                        "--max-updates and --max-epochs must be >= 0")
        check_condition(self.max_updates > 0 or self.max_epochs > 0,
                        "set --max-updates or --max-epochs (both are 0: training would not stop)")
        check_condition(self.checkpoint_interval >= 1, "--checkpoint-interval must be >= 1")
        check_condition(self.guide_weight >= 0, "--guide-weight must be >= 0")
        check_condition(self.agreement_weight >= 0, "--agreement-weight must be >= 0")
        check_condition(self.log_interval >= 1, "log interval must be >= 1")
        check_condition(self.precision in C.PRECISIONS,
                        f"--precision must be one of {', '.join(C.PRECISIONS)} "
                        f"(got '{self.precision}')")

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Dict[str, Any], what: str = "training config") -> "TrainConfig":
        # join_lines: the trainer's own joining of pairs, which some model directories of
        # 0.1.0 record; the bitext's lines are joined before training now (--join-lines,
        # aligner/training/joined_text.py), so it no longer describes the weights' training
        values = {key: value for key, value in values.items() if key != "join_lines"}
        return dataclass_from_dict(cls, values, what)


#: training options that may differ when a run is resumed (everything else must match)
RESUMABLE_CHANGES = ("max_updates", "max_epochs", "checkpoint_interval", "log_interval", "device",
                     "precision", "deterministic")
#: config.json ``extra`` entries that hold a path (the --init-from and --base model
#: directories): on resume only whether there is one is compared here
#: (:meth:`RunConfig.differences`), their weights by aligner.training.corpus.check_inputs
PATH_EXTRAS = ("init_from", "base")


#: the checkpoint interval of a run with no validation set (align run, align demo, the
#: alignment layer's stage-0 recipe): a checkpoint serves only --resume, and one is written at
#: the end of each training (round) anyway (align train's --checkpoint-interval:
#: TrainConfig.checkpoint_interval)
CHECKPOINT_AT_THE_END = 10 ** 9


@dataclass
class RunConfig:
    """The content of ``config.json``: every hyper-parameter of a model directory.

    models: model config dict per direction (``{"fwd": {...}, "rev": {...}}``), in the form the
        model kind's ``config_class.from_dict`` reads (vocabulary sizes swap between directions).
    extra: free-form settings of a model kind (e.g. the alignment layer's base model).
    """

    model_kind: str
    directions: List[str]
    models: Dict[str, Dict[str, Any]]
    prep: Dict[str, Any]
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainConfig = field(default_factory=TrainConfig)
    extra: Dict[str, Any] = field(default_factory=dict)
    format_version: int = C.MODEL_FORMAT_VERSION
    package_version: str = __version__

    def to_dict(self) -> Dict[str, Any]:
        return {"format_version": self.format_version, "package_version": self.package_version,
                "model_kind": self.model_kind, "directions": list(self.directions),
                "models": self.models, "prep": self.prep, "data": self.data.to_dict(),
                "training": self.training.to_dict(), "extra": self.extra,
                "seed": self.training.seed}

    @classmethod
    def from_dict(cls, values: Dict[str, Any], what: str = "config") -> "RunConfig":
        check_condition(isinstance(values, dict), f"{what}: expected a JSON object")
        version = values.get("format_version")
        check_condition(version == C.MODEL_FORMAT_VERSION,
                        f"{what}: model format version {version} is not supported "
                        f"(this is version {C.MODEL_FORMAT_VERSION} of the format)")
        missing = [key for key in ("model_kind", "directions", "models", "prep", "training")
                   if key not in values]
        check_condition(not missing, f"{what}: missing keys {', '.join(missing)}")
        check_condition(isinstance(values["model_kind"], str),
                        f"{what}: model_kind must be a string, not {values['model_kind']!r}")
        directions = values["directions"]
        check_condition(isinstance(directions, list) and directions
                        and all(d in C.DIRECTIONS for d in directions),
                        f"{what}: directions must be a non-empty subset of {list(C.DIRECTIONS)}, "
                        f"not {directions!r}")
        for key in ("models", "prep", "extra"):
            check_condition(isinstance(values.get(key, {}), dict),
                            f"{what}: {key} must be a JSON object")
        for direction in directions:
            check_condition(isinstance(values["models"].get(direction), dict),
                            f"{what}: models.{direction}: the model config of direction "
                            f"{direction} is missing or not a JSON object")
        return cls(model_kind=values["model_kind"], directions=list(directions),
                   models=values["models"], prep=values["prep"],
                   data=DataConfig.from_dict(values.get("data", {}), f"{what}: data"),
                   training=TrainConfig.from_dict(values["training"], f"{what}: training"),
                   extra=values.get("extra", {}), format_version=version,
                   package_version=str(values.get("package_version", "unknown")))

    def save(self, path: str) -> None:
        with atomic_output(path) as out:
            json.dump(self.to_dict(), out, indent=2, sort_keys=True)
            out.write("\n")

    @classmethod
    def load(cls, path: str) -> "RunConfig":
        check_condition(os.path.isfile(path), f"{path}: missing (model directory incomplete)")
        try:
            with open(path, encoding="utf-8") as handle:
                values = json.load(handle)
        except (ValueError, UnicodeDecodeError) as error:
            raise AlignerError(f"{path}: not valid JSON ({error})") from None
        return cls.from_dict(values, what=path)

    def differences(self, other: "RunConfig") -> List[str]:
        """Names of settings that differ from `other`, ignoring RESUMABLE_CHANGES — but for
        the run's length (max_updates, max_epochs) under the linear learning-rate schedule,
        whose decay ends at the run's last update: resumed with another length it would jump."""
        mine, theirs = self.to_dict(), other.to_dict()
        linear = "linear" in (self.training.lr_schedule, other.training.lr_schedule)
        for values in (mine, theirs):
            values.pop("package_version")
            # paths say where a file lies, not what it holds: the same run resumed as
            # `-o ./dir`, from another working directory or after the directory moved names
            # them otherwise. Whether there is a guide counts; its content is compared by
            # aligner.training.corpus.check_inputs.
            values["data"]["guide"] = bool(values["data"].get("guide"))
            values["extra"] = {key: (bool(value) if key in PATH_EXTRAS else value)
                               for key, value in (values.get("extra") or {}).items()}
            for key in RESUMABLE_CHANGES:
                if not (linear and key in ("max_updates", "max_epochs")):
                    values["training"].pop(key)
        return sorted(_diff_keys(mine, theirs))


def _diff_keys(a: Any, b: Any, prefix: str = "") -> List[str]:
    """Dotted keys whose values differ between two nested dicts."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys: List[str] = []
        for key in sorted(set(a) | set(b)):
            keys += _diff_keys(a.get(key), b.get(key), f"{prefix}{key}.")
        return keys
    return [] if a == b else [prefix.rstrip(".")]

