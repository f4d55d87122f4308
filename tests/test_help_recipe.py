"""The --help of the commands that train says what the recipe (aligner/training/recipe.py)
does: its rounds, its teacher, its epochs, its output (issue 53: the help said "four
self-training rounds" after the recipe had become two rounds after a teacher)."""
from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from aligner.cli import main
from aligner.training import recipe

NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                "eight": 8, "nine": 9, "ten": 10}


def command_help(command: str) -> str:
    """The text of `align COMMAND --help` above its options, whitespace normalized."""
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=100_000,
                                max_content_width=100_000)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split("Options:", 1)[0].split())


@pytest.mark.parametrize("command", ["train", "run", "demo"])
def test_the_help_says_the_recipes_rounds_and_teacher(command):
    text = command_help(command)
    # every count of self-training rounds the help gives is the recipe's
    counts = re.findall(r"(\w+) self-training rounds", text)
    assert counts, text
    assert {NUMBER_WORDS.get(count) or int(count) for count in counts} == {recipe.ROUNDS}, \
        counts
    assert ("guided by the links of a classical teacher" in text) == recipe.TEACHER
    assert recipe.MODEL_KIND in text
    mixed = (f"{recipe.METHOD} alignments, each direction's mixed with the teacher's at "
             f"weight {recipe.MIX_WEIGHT:g}")
    # the demo's table is the network's alone (its help says so: --mix-weight 0)
    assert (mixed in text) == (command != "demo")
    if command == "demo":
        assert "--mix-weight 0" in text
    assert f"combined by -H {recipe.HEURISTIC} at threshold {recipe.THRESHOLD:g}" in text
    assert f"{recipe.FINE_TUNE_LR_SCHEDULE} learning-rate decay" in text
    epochs = f"{recipe.FINE_TUNE_EPOCHS} epoch" + ("" if recipe.FINE_TUNE_EPOCHS == 1 else "s")
    assert epochs in text


@pytest.mark.parametrize("command", ["train", "run"])
def test_train_and_run_give_the_recipes_round_length(command):
    text = command_help(command)
    first = f"{recipe.EPOCHS_PER_ROUND} epoch" + ("" if recipe.EPOCHS_PER_ROUND == 1 else "s")
    assert f"{recipe.ROUNDS} self-training rounds of {first} each" in text \
        or f"({first} in round 1" in text


def test_demo_names_its_deviations_from_the_recipe():
    text = command_help("demo")
    for key, value in recipe.DEMO_MODEL_OPTIONS.items():
        assert f"{key} {value}" in text
    assert f"batches of {recipe.DEMO_TRAINING['max_tokens']} tokens" in text
    assert f"lr {recipe.DEMO_TRAINING['lr']:g}" in text


def test_the_help_follows_the_recipe(monkeypatch):
    """The help is made from the recipe's values, not written beside them: another recipe
    gives another help."""
    from aligner.cli import options

    monkeypatch.setattr(recipe, "ROUNDS", 5)
    monkeypatch.setattr(recipe, "TEACHER", False)
    text = options.recipe_summary()
    assert "in 5 self-training rounds" in text
    assert "guided by the links of a classical teacher" not in text
    assert "round 1 trains unguided" in text


def test_an_unbounded_float_prints_no_range():
    """align extract --sgd-lr (a finite float, no bounds) printed "[x<=None]"."""
    result = CliRunner().invoke(main, ["extract", "--help"], terminal_width=100_000,
                                max_content_width=100_000)
    assert result.exit_code == 0
    line = next(line for line in result.output.splitlines() if "--sgd-lr" in line)
    assert "None" not in line and line.rstrip().endswith("[default: 1.0]")
