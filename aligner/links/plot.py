"""Heat maps of soft alignment matrices of one sentence pair (matplotlib, an optional extra).

Every panel is one matrix of shape (source words, target words): source words are the rows
(y axis, top to bottom), target words the columns (x axis, left to right), the value the
colour (0 white .. 1 dark). Gold links are drawn on every panel: sure links as filled
squares, possible-only links as hollow squares. No torch here; matplotlib is imported only
when drawing (the Agg canvas, so no display and no global pyplot state).
"""
from __future__ import annotations

import importlib
import math
from typing import IO, Optional, Sequence, Tuple

import numpy as np

from aligner.formats import GoldAlignment
from aligner.utils import AlignerError, check_condition

#: inches per word of a panel, and the room for tick labels and the title
INCH_PER_WORD = 0.32
PANEL_MARGIN = 1.6
MAX_COLUMNS = 2
#: the largest figure drawn: matplotlib's Agg canvas takes less than 2**16 pixels a side, and
#: 2**28 pixels in all is 1 GiB of RGBA buffer
MAX_SIDE_PIXELS = 2 ** 16 - 1
MAX_PIXELS = 2 ** 28


def require_matplotlib() -> None:
    """One-line error when the optional extra is missing."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise AlignerError("drawing needs matplotlib: pip install matplotlib "
                           "(or pip install 'aligner[plot]')") from None


def grid(n_panels: int) -> Tuple[int, int]:
    """(rows, columns) of the panel grid: at most MAX_COLUMNS panels side by side."""
    columns = min(n_panels, MAX_COLUMNS)
    return math.ceil(n_panels / columns), columns


def figure_size(n_panels: int, n_src: int, n_tgt: int) -> Tuple[float, float]:
    """(width, height) in inches of a figure of `n_panels` panels of n_src × n_tgt words.

    The PNG is exactly ``round(width * dpi)`` × ``round(height * dpi)`` pixels.
    """
    rows, columns = grid(n_panels)
    width = columns * (INCH_PER_WORD * max(n_tgt, 4) + PANEL_MARGIN)
    height = rows * (INCH_PER_WORD * max(n_src, 4) + PANEL_MARGIN)
    return round(width, 2), round(height, 2)


def check_figure_pixels(size: Tuple[float, float], dpi: int, name: str = "figure") -> None:
    """Raise AlignerError (naming `name`) when a figure of `size` inches at `dpi` is larger
    than MAX_SIDE_PIXELS a side or MAX_PIXELS in all: refuse it before any work rather than
    fail in matplotlib (or run out of memory) while drawing."""
    width, height = round(size[0] * dpi), round(size[1] * dpi)
    check_condition(max(width, height) <= MAX_SIDE_PIXELS and width * height <= MAX_PIXELS,
                    f"{name}: a figure of {width}x{height} pixels is too large to draw (at most "
                    f"{MAX_SIDE_PIXELS} a side and {MAX_PIXELS:,} in all): lower --dpi or draw "
                    f"fewer panels (-m, --direction)")


def draw_alignments(out: IO[bytes], panels: Sequence[Tuple[str, np.ndarray]],
                    src_words: Sequence[str], tgt_words: Sequence[str],
                    gold: Optional[GoldAlignment] = None, dpi: int = 100,
                    title: Optional[str] = None) -> Tuple[float, float]:
    """Write a PNG of the `panels` (title, matrix (len(src_words), len(tgt_words))) to `out`.

    Values are clipped to [0, 1]. `gold` links are (source word, target word), 0-based.
    Returns the figure size in inches (see :func:`figure_size`). A figure too large to draw
    raises AlignerError (see :func:`check_figure_pixels`).
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    check_condition(len(panels) > 0, "nothing to draw")
    shape = (len(src_words), len(tgt_words))
    for name, matrix in panels:
        check_condition(matrix.shape == shape, f"{name}: matrix of shape {matrix.shape}, "
                                               f"expected {shape} (source × target words)")
    rows, columns = grid(len(panels))
    size = figure_size(len(panels), *shape)
    check_figure_pixels(size, dpi)
    figure = Figure(figsize=size, dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False)
    image = None
    for ax, (name, matrix) in zip(axes.flat, panels):
        image = ax.imshow(np.clip(matrix, 0.0, 1.0), cmap="Greys", vmin=0.0, vmax=1.0,
                          aspect="equal", interpolation="nearest")
        ax.set_title(name, fontsize=9)
        ax.set_xticks(range(shape[1]), tgt_words, rotation=90, fontsize=7)
        ax.set_yticks(range(shape[0]), src_words, fontsize=7)
        ax.tick_params(length=0)
        if gold is not None:
            _draw_gold(ax, gold)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_axis_off()
    if image is not None:
        figure.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.savefig(out, format="png", dpi=dpi)
    return size


def _draw_gold(ax, gold: GoldAlignment) -> None:
    """Sure links: filled red squares (0.6 of a cell); possible-only links: hollow red squares
    (0.8 of a cell). Drawn in data coordinates, so they scale with the cells."""
    from matplotlib.patches import Rectangle

    for i, j in sorted(gold.sure):
        ax.add_patch(Rectangle((j - 0.3, i - 0.3), 0.6, 0.6, color="tab:red", linewidth=0))
    for i, j in sorted(gold.possible - gold.sure):
        ax.add_patch(Rectangle((j - 0.4, i - 0.4), 0.8, 0.8, facecolor="none",
                               edgecolor="tab:red", linewidth=1.0))
