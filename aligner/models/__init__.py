"""Registry of model kinds: ``MODELS`` maps the name used by ``align train --model`` to its class.

Every class is an :class:`aligner.models.base.AlignmentModel` with

* ``METHODS`` — the extraction methods it supports (``align extract --method``);
* ``config_class`` — a dataclass with ``to_dict()`` / ``from_dict()`` holding every
  hyper-parameter; ``cls(config)`` builds the model.

Adding a model kind = one line in ``MODELS``. Importing this package imports torch.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple, Type

from aligner.models.alignment_layer import AlignmentLayerModel
from aligner.models.base import AlignmentModel
from aligner.models.direct_hmm import FirstOrderHMM, ZeroOrderHMM
from aligner.models.transformer import Transformer, TransformerConfig
from aligner.utils import check_condition

MODELS: Dict[str, Type[AlignmentModel]] = {
    "transformer": Transformer,
    "alignment-layer": AlignmentLayerModel,
    "hmm0": ZeroOrderHMM,
    "hmm1": FirstOrderHMM,
}

#: extraction methods per model kind (first = default of ``align extract``)
METHODS_BY_KIND: Dict[str, Tuple[str, ...]] = {name: cls.METHODS for name, cls in MODELS.items()}


def model_class(kind: str) -> Type[AlignmentModel]:
    """The class registered as `kind` (one-line error for an unknown kind)."""
    check_condition(kind in MODELS,
                    f"unknown model kind '{kind}' (choose from {', '.join(sorted(MODELS))})")
    return MODELS[kind]


def build_model(kind: str, config_dict: Dict[str, Any]) -> AlignmentModel:
    """A freshly initialized model of `kind` from its config dict (as saved in config.json)."""
    cls = model_class(kind)
    config_class = getattr(cls, "config_class", TransformerConfig)
    return cls(config_class.from_dict(dict(config_dict)))
