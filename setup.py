"""Install the `aligner` package and its `align` command line.

torch is listed without an upper bound. On a machine with a local CPU wheel, install
`torch==<version>` first (see README.md); pip then sees the requirement satisfied and does not
pull CUDA packages. GPU users install the torch build of their choice first in the same way.

The floor, torch 2.4: the device-generic autocast queries torch.is_autocast_enabled(device_type)
and torch.get_autocast_dtype(device_type) (aligner/models/direct_hmm.py,
aligner/extract/inference.py, aligner/translate.py) came with torch 2.4 (pytorch PR #124359;
huggingface/transformers PR #43509 guards the same call for torch < 2.4); the rest of the package
uses older API. Checked by running: the whole test suite passes on torch 2.4.1 (its PyPI wheel, on
the CPU) and 2.13.0, and the CUDA tests (pytest -m cuda) on 2.11.0+cu130 on an H100
(eval/results/gpu_enfr.md).
"""
import re
from pathlib import Path

from setuptools import find_packages, setup

VERSION = re.search(r'__version__ = "([^"]+)"',
                    Path(__file__).with_name("aligner").joinpath("__init__.py").read_text()).group(1)

setup(
    name="aligner",
    version=VERSION,
    description="Neural word alignment: direct HMM and alignment-layer transformers, "
                "Pharaoh output, symmetrization and AER scoring",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["aligner", "aligner.*"]),
    python_requires=">=3.9",
    install_requires=[
        "torch>=2.4",   # see the module docstring
        "click>=8.0",
        "numpy",
        "sacremoses",
        "subword-nmt",
        "tqdm",
        "sacrebleu>=2.0",
    ],
    extras_require={
        "dev": ["pytest"],
        "plot": ["matplotlib"],
    },
    entry_points={"console_scripts": ["align=aligner.cli:main"]},
)
