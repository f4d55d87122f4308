"""Bars on learned quality: what a test that trains a tiny model measures, and what it asserts.

Floating-point results differ between CPUs (kernels, vector widths, reduction order) and thread
counts, so a test that trains and then asserts a quality threshold must not depend on one
machine's rounding. Each such test measures through a :class:`Bar`: a function of the seed
(which drives the initialization and the data) and the bar the value must pass. The test runs
seed 0; ``eval/test_margins.py`` runs the same functions over seeds 0-9 under several kernel
settings and thread counts and records the range (eval/results/test_margins.md). A bar is set
well inside that range: the worst seed on the worst setting still passes with room to spare.

Test modules list their bars in a module-level ``BARS`` list, which eval/test_margins.py reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


#: how the margins quoted in the tests were measured
MEASURED_OVER = ("over seeds 0-9 with AVX-512, AVX2 and generic kernels (ATEN_CPU_CAPABILITY), "
                 "1 thread: eval/results/test_margins.md")


@dataclass(frozen=True)
class Bar:
    """name: what is measured; measure(seed) -> value; the value must be > `above` and/or
    < `below`; margin: the range measured over seeds and settings (for the failure message;
    :data:`MEASURED_OVER` is appended)."""

    name: str
    measure: Callable[[int], float]
    above: Optional[float] = None
    below: Optional[float] = None
    margin: str = ""

    def __post_init__(self):
        object.__setattr__(self, "margin", f"{self.margin} {MEASURED_OVER}")

    def passes(self, value: float) -> bool:
        return ((self.above is None or value > self.above)
                and (self.below is None or value < self.below))

    def describe(self) -> str:
        parts = [f"> {self.above}" if self.above is not None else "",
                 f"< {self.below}" if self.below is not None else ""]
        return " and ".join(part for part in parts if part)

    def check(self, seed: int = 0) -> float:
        """Measure with `seed` and assert the bar; returns the value."""
        value = self.measure(seed)
        assert self.passes(value), (f"{self.name}: {value:.4f} with seed {seed}, the bar is "
                                    f"{self.describe()} (measured over seeds: {self.margin})")
        return value
