"""aligner: neural word alignment with direct-HMM and alignment-layer transformers.

Light-weight on import: nothing here imports torch, so `align symmetrize` and
`align score-aer` start instantly.
"""
__version__ = "0.1.0"
