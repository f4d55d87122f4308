"""README.md stays a ten-minute read in a user's order (issue #53 item 6): at most 300 lines,
its '## ' sections in the order install -> use -> reference -> results, and every
eval/results/... file it names present. History goes to eval/results/HISTORY.md."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

MAX_LINES = 300
SECTIONS = [
    "What it is",
    "Install and demo",
    "Test",
    "Align your corpus",
    "The commands",
    "Formats",
    "Pipelines",
    "Large corpora and torchrun",
    "GPU",
    "Python API",
    "Results",
    "Data",
]


def _text():
    return README.read_text(encoding="utf-8")


def test_readme_at_most_300_lines():
    lines = _text().splitlines()
    assert len(lines) <= MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_LINES}): move detail into "
        "eval/results/*.md or a command's --help, history into eval/results/HISTORY.md")


def test_readme_sections_in_order():
    headings = [line[3:].strip() for line in _text().splitlines() if line.startswith("## ")]
    assert headings == SECTIONS


def test_readme_results_paths_exist():
    names = set(re.findall(r"eval/results/[\w./-]*[\w]", _text()))
    assert "eval/results/HISTORY.md" in names
    missing = sorted(name for name in names if not (ROOT / name).exists())
    assert not missing, missing
