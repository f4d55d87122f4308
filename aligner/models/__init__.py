"""Registry of model kinds: ``MODELS`` maps the name used by ``align train --model`` to its class.

Every class is a concrete :class:`aligner.models.base.AlignmentModel` (the contract: ``METHODS``,
``config_class``, ``loss``, ``alignment_scores`` and the optional hooks with their defaults,
see aligner/models/base.py); ``cls(cls.config_class.from_dict(...))`` builds the model.
What differs by kind (default methods, best heuristic, two-stage training) is read from these
classes; the few spelled-out lists that keep the CLI's help torch-free are checked against
them (tests/test_model_contract.py, tests/test_extract.py).

Adding a model kind = one line in ``MODELS``. Importing this package imports torch.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple, Type

from aligner.models.alignment_layer import AlignmentLayerModel
from aligner.models.base import AlignmentModel
from aligner.models.classical import ClassicalHMM
from aligner.models.direct_hmm import FirstOrderHMM, ZeroOrderHMM
from aligner.models.transformer import Transformer
from aligner.utils import check_condition

MODELS: Dict[str, Type[AlignmentModel]] = {
    "transformer": Transformer,
    "alignment-layer": AlignmentLayerModel,
    "hmm0": ZeroOrderHMM,
    "hmm1": FirstOrderHMM,
    "classical": ClassicalHMM,
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
    return cls(cls.config_class.from_dict(dict(config_dict)))
