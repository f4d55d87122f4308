"""Install the `aligner` package and its `align` command line.

torch is listed without an upper bound. On a machine with a local CPU wheel, install
`torch==<version>` first (see README.md); pip then sees the requirement satisfied and does not
pull CUDA packages. GPU users install the torch build of their choice first in the same way.
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
        "torch>=2.1",
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
