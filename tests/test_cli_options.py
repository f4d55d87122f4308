"""An option that two commands share has the same help text in both (issue 28: `align train
--help` and `align run --help` give the same text for the same option).

The help is read as a user sees it (`align COMMAND --help`, one line per option) and compared
without the trailing "[default: ...]" / range / "[required]" notes: a default may differ between
commands (align demo trains a small model), what the option does may not.
"""
from __future__ import annotations

import itertools
import re
from typing import Dict

from click.testing import CliRunner

from aligner.cli import main

#: the commands that train (aligner/cli/options.py declares their shared options once): every
#: option name two of them share must have the same help
TRAINING = ("train", "run", "demo")
#: names that two commands share with another meaning or not (yet) from aligner/cli/options.py,
#: where at most one of the two commands is in TRAINING
OUTSIDE_TRAINING = {
    "-o": "the file or directory each command writes (align train: the model directory)",
    "--output": "the file each command writes: alignments, a PNG, translations",
    "-i": "a bitext; align translate: the sentences to translate; score-aer, symmetrize: "
          "only to check link indices",
    "--input": "as -i",
    "-s": "score-aer and symmetrize read the bitext only to check link indices",
    "--source": "as -s",
    "-t": "as -s",
    "--target": "as -s",
    "-f": "align run writes the fwd links there; align symmetrize reads them",
    "-r": "align run writes the rev links there; align symmetrize reads them",
    "--reverse": "score-aer: a flag; symmetrize: the reverse alignments",
    "--direction": "extract: which alignments; show: which panels; translate: which way",
    "-m": "extract: the method that aligns; show: the methods drawn (repeatable)",
    "--method": "as -m",
    "-O": "extract: the method's options; show: every drawn method's",
    "--method-option": "as -O",
    "--max-tokens": "training batches (train, run) or inference batches (extract, translate)",
    "--precision": "training (train, run) or inference (extract, translate)",
    "--link-probs": "extract writes the link probabilities there; score-aer reads them",
    "--resume": "train, run: the run in --model-dir; extract: the blocks kept in -o's FILE.parts",
    "--overwrite": "train, run: the run in --model-dir; extract: the parts folder FILE.parts",
    "-H": "not yet shared with extract, symmetrize",
    "--symmetrize": "as -H",
    "--threshold": "not yet shared with extract",
    "--soft": "as --threshold",
    "-g": "not yet shared with score-aer, show",
    "--gold": "as -g",
    "--gold-format": "not yet shared between score-aer and show",
}
#: click's notes at the end of a help text: "  [default: 3; x>=1]", "  [required]"
NOTES = re.compile(r"(\s{2}\[[^\[\]]*\])+$")


def option_helps(command: str) -> Dict[str, str]:
    """Option name (-s and --source alike) -> its help text in `align COMMAND --help`,
    whitespace normalized, the trailing notes removed."""
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=100_000,
                                max_content_width=100_000)
    assert result.exit_code == 0, result.output
    lines = result.output.split("Options:\n", 1)[1].splitlines()
    helps: Dict[str, str] = {}
    names = None
    for line in lines:
        if not line.strip():
            break
        match = re.match(r"^  (-\S.*?)(?:\s{2,}(.*))?$", line)
        if match:    # "  -s, --source FILE  Source sentences ..." (help maybe on the next line)
            column, text = match.groups()
            names = [token for token in re.split(r"[ ,/]+", column) if token.startswith("-")]
        else:        # the help of a long option column, on a line of its own
            text = line
        if text and names:
            text = " ".join(NOTES.sub("", text.rstrip()).split())
            for name in names:
                helps[name] = text
        elif names:
            for name in names:
                helps.setdefault(name, "")
    return helps


def all_helps() -> Dict[str, Dict[str, str]]:
    return {name: option_helps(name) for name in sorted(main.commands)}


def test_the_parser_reads_every_option():
    helps = option_helps("train")
    assert helps["-s"] == helps["--source"] == "Source sentences, one per line."
    assert helps["--bpe-min-frequency"] == ""             # only "[default: 2; x>=1]"
    assert helps["--fine-tune"] == helps["--afresh"] != ""
    assert helps["--lr-schedule"].startswith("Decay after the warm-up")   # on its own line
    assert not helps["--max-epochs"].endswith("]")        # the notes are cut off


def test_shared_options_have_one_help_text():
    helps = all_helps()
    differences = []
    for one, other in itertools.combinations(sorted(helps), 2):
        for name in sorted(helps[one].keys() & helps[other].keys()):
            if helps[one][name] == helps[other][name]:
                continue
            if name in OUTSIDE_TRAINING and not (one in TRAINING and other in TRAINING
                                                 and name not in ("-o",)):
                continue
            differences.append(f"{name}: align {one}: {helps[one][name]!r} / align {other}: "
                               f"{helps[other][name]!r}")
    assert not differences, "\n".join(differences)


def test_listed_differences_are_still_there():
    """OUTSIDE_TRAINING names no name that every command taking it now explains alike."""
    helps = all_helps()
    for name in OUTSIDE_TRAINING:
        texts = {command_helps[name] for command_helps in helps.values() if name in command_helps}
        assert len(texts) > 1, f"{name}: now the same in every command; drop it from the list"


def test_train_and_run_share_their_training_options():
    train, run = option_helps("train"), option_helps("run")
    for name in ("--model-dir", "--bpe-merges", "-M", "--max-tokens", "--max-updates",
                 "--guide", "--guide-weight", "--rounds", "--self-guide-weight",
                 "--fine-tune", "--agreement-weight", "--resume", "--overwrite", "--device",
                 "--precision", "--seed", "--threads", "-q"):
        assert train[name] == run[name] != "", name


def test_max_tokens_counts_padded_positions():
    # batches hold max(source, target) length x sentences (aligner.config.TrainConfig)
    for command in ("train", "run"):
        text = option_helps(command)["--max-tokens"]
        assert "target tokens" not in text and "Padded tokens" in text, (command, text)


def test_inference_commands_declare_their_options_once():
    """extract, show and translate take --checkpoint, --device, --threads and -q from
    aligner/cli/options.py (one help text, also the training commands' where they have it);
    extract and translate share the inference --precision."""
    extract, show, translate = (option_helps(c) for c in ("extract", "show", "translate"))
    for name in ("--checkpoint", "--device", "--threads", "-q"):
        assert extract[name] == show[name] == translate[name] != "", name
    for name in ("--device", "--threads", "-q"):
        assert extract[name] == option_helps("train")[name], name
    assert extract["--precision"] == translate["--precision"] != option_helps("run")[
        "--precision"]
