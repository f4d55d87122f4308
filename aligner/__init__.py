"""aligner: neural word alignment with direct-HMM and alignment-layer transformers.

Light-weight on import: nothing here imports torch, so `align symmetrize` and
`align score-aer` start instantly.
"""
__version__ = "0.1.0"


def __getattr__(name: str):
    """``from aligner import Aligner`` loads the API (and torch) only when asked for."""
    if name == "Aligner":
        from aligner.api import Aligner
        return Aligner
    raise AttributeError(f"module 'aligner' has no attribute '{name}'")
