"""`align show`: a PNG with the right size (figure inches × dpi), gold links drawn, and
one-line errors (matplotlib missing, bad line, bad method, gold outside the pair)."""
from __future__ import annotations

import struct
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from aligner.cli import main
from aligner.models import MODELS
from synthetic import write_corpus
from test_api import make_model_dir

pytest.importorskip("matplotlib")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    """(width, height) from the IHDR chunk, which must come right after the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def red_pixels(path):
    """Number of reddish pixels (gold links are tab:red; everything else is grey or black)."""
    from matplotlib.image import imread
    image = imread(str(path))[..., :3]
    return int(((image[..., 0] - image[..., 1:].max(axis=-1)) > 0.25).sum())


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("show")
    directory, sources, targets, golds = make_model_dir(root)
    golds = [set(g) for g in golds[:5]]
    src, tgt, gold = write_corpus(root, "test", sources[:5], targets[:5], golds)
    return root, directory, src, tgt, gold, sources, targets


def run(*args):
    return CliRunner().invoke(main, ["show", *map(str, args)])


def test_writes_a_png_of_figure_size_times_dpi_with_one_panel_per_method_and_direction(setup):
    from aligner.links.plot import figure_size
    root, directory, src, tgt, gold, sources, targets = setup
    out = root / "pair.png"
    result = run(directory, "-s", src, "-t", tgt, "--line", 3, "-o", out, "--dpi", 40,
                 "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 1000
    n_panels = len(MODELS["transformer"].METHODS) * 2         # 2 methods × fwd, rev
    width, height = figure_size(n_panels, len(sources[2]), len(targets[2]))
    assert png_size(out) == (round(width * 40), round(height * 40))
    # one method, one direction: one panel, a narrower picture; the dpi scales the pixels
    one = root / "one.png"
    result = run(directory, "-s", src, "-t", tgt, "--line", 3, "-o", one, "--dpi", 80,
                 "-m", "attention", "--direction", "fwd", "--device", "cpu")
    assert result.exit_code == 0, result.output
    width, height = figure_size(1, len(sources[2]), len(targets[2]))
    assert png_size(one) == (round(width * 80), round(height * 80))
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]


def test_gold_links_are_drawn(setup):
    root, directory, src, tgt, gold, _, _ = setup
    plain, with_gold = root / "plain.png", root / "gold.png"
    for out, extra in ((plain, []), (with_gold, ["-g", gold])):
        result = run(directory, "-s", src, "-t", tgt, "-n", 2, "-o", out, "--dpi", 60,
                     "--direction", "fwd", "-m", "attention", *extra)
        assert result.exit_code == 0, result.output
    assert png_size(plain) == png_size(with_gold)
    assert red_pixels(plain) == 0 and red_pixels(with_gold) > 20


def test_draw_alignments_by_hand(tmp_path):
    """Sure links are filled squares, possible-only ones hollow (fewer red pixels)."""
    from aligner.formats import GoldAlignment
    from aligner.links.plot import draw_alignments
    matrix = np.zeros((3, 2))
    sizes = {}
    for name, gold in (("sure", GoldAlignment({(0, 0), (2, 1)})),
                       ("possible", GoldAlignment(set(), {(0, 0), (2, 1)}))):
        path = tmp_path / f"{name}.png"
        with open(path, "wb") as out:
            assert draw_alignments(out, [("m", matrix)], ["a", "b", "c"], ["x", "y"], gold,
                                   dpi=50) == (2.88, 2.88)
        assert png_size(path) == (144, 144)
        sizes[name] = red_pixels(path)
    assert 0 < sizes["possible"] < sizes["sure"]
    from aligner.utils import AlignerError
    with pytest.raises(AlignerError, match=r"m: matrix of shape \(2, 2\), expected \(3, 2\)"):
        draw_alignments(open(tmp_path / "bad.png", "wb"), [("m", np.zeros((2, 2)))],
                        ["a", "b", "c"], ["x", "y"])


@pytest.mark.parametrize("extra, message", [
    (["--line", 9], r"test.src: --line 9 is past the last line \(5\)"),
    (["-m", "hmm-posterior"], r"unknown method 'hmm-posterior' for model kind 'transformer'"),
    (["-g", "BADGOLD"], r"bad.talp:1: link '0-40' outside the sentence pair"),
])
def test_bad_input_is_one_line_and_writes_nothing(setup, extra, message):
    root, directory, src, tgt, gold, _, _ = setup
    bad_gold = root / "bad.talp"
    bad_gold.write_text("0-40\n" * 5)
    extra = [str(bad_gold) if e == "BADGOLD" else e for e in extra]
    out = root / "never.png"
    result = run(directory, "-s", src, "-t", tgt, "-o", out, *extra)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("align: error:"), result.output
    assert pytest.importorskip("re").search(message, lines[0]), lines[0]
    assert not out.exists()


def test_missing_matplotlib_is_one_line_naming_pip(setup, monkeypatch):
    root, directory, src, tgt, _, _, _ = setup
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib -> ImportError
    result = run(directory, "-s", src, "-t", tgt, "-o", root / "x.png")
    assert result.exit_code == 1
    assert result.output.strip() == ("align: error: drawing needs matplotlib: pip install "
                                     "matplotlib (or pip install 'aligner[plot]')")


@pytest.mark.parametrize("kind", ["hmm0", "hmm1", "alignment-layer"])
def test_every_model_kind_gets_one_panel_per_method(tmp_path, kind):
    from aligner.links.plot import figure_size
    directory, sources, targets, golds = make_model_dir(tmp_path, kind)
    src, tgt, gold = write_corpus(tmp_path, "x", sources[:2], targets[:2], golds[:2])
    out = tmp_path / "kind.png"
    result = run(directory, "-s", src, "-t", tgt, "-n", 2, "-g", gold, "-o", out, "--dpi", 30,
                 "--direction", "rev", "--device", "cpu")
    assert result.exit_code == 0, result.output
    width, height = figure_size(len(MODELS[kind].METHODS), len(sources[1]), len(targets[1]))
    assert png_size(out) == (round(width * 30), round(height * 30))
