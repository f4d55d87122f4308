"""Outputs and options that a hostile user gets wrong: each is refused up front with one
`align: error:` line and nothing written.

* unwritable -o / --soft (immutable file or directory, missing directory) for `align
  symmetrize`, `align extract`, `align show`: refused before any work (the model directory
  below does not even exist, so a later check would name it instead), and atomic_output turns
  an OSError of its temporary file or rename into one AlignerError;
* `align show` of a pair longer than the model's max_positions, or of a figure too large to
  draw;
* `align extract --soft -` and an extract that fails half way: no -o file, no .npz;
* `-O KEY=VALUE` of an unknown key or a value of the wrong type.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from aligner.cli import main
from aligner.utils import AlignerError, atomic_output, check_writable
from synthetic import write_corpus
from test_api import make_model_dir


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def error_line(result) -> str:
    """The one 'align: error: ...' line (exit 1, no traceback)."""
    assert result.exit_code == 1, (result.output, result.exception)
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("align: error: "), result.output
    return lines[0]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """An untrained tiny transformer model directory (max_positions 16) and 3 test pairs."""
    root = tmp_path_factory.mktemp("reliability")
    directory, sources, targets, golds = make_model_dir(root)
    src, tgt, gold = write_corpus(root, "test", sources[:3], targets[:3], golds[:3])
    return root, directory, src, tgt, gold


@pytest.fixture
def immutable(tmp_path):
    """Make paths immutable with `chattr +i` (undone afterwards); skip where chattr cannot."""
    probe = tmp_path / "probe"
    probe.write_text("")
    if shutil.which("chattr") is None or subprocess.run(
            ["chattr", "+i", str(probe)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i not available here")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    probe.unlink()
    done = []

    def make(path):
        subprocess.run(["chattr", "+i", str(path)], check=True)
        done.append(path)
        return path

    yield make
    for path in done:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def commands(setup, output, soft_output=False):
    """Every command with an output file, given a model directory that does not exist."""
    root, _, src, tgt, gold = setup
    nope = root / "no-such-model"
    yield ["symmetrize", "-f", "NO-SUCH-FILE", "-r", gold, "-o", output]
    yield ["extract", nope, "-s", src, "-t", tgt, "-o", output]
    yield ["extract", nope, "-s", src, "-t", tgt, "--soft", output]
    yield ["show", nope, "-s", src, "-t", tgt, "-o", output]


def test_immutable_output_file_or_directory_is_refused_before_the_work(setup, tmp_path,
                                                                         immutable):
    frozen = tmp_path / "frozen.txt"
    frozen.write_text("old\n")
    immutable(frozen)
    for args in commands(setup, frozen):
        assert error_line(run(*args)) == (f"align: error: {frozen}: output file is not "
                                          f"writable (read-only or immutable)"), args
    assert frozen.read_text() == "old\n"
    folder = tmp_path / "folder"
    folder.mkdir()
    immutable(folder)
    for args in commands(setup, folder / "out.txt"):
        assert error_line(run(*args)) == (f"align: error: {folder / 'out.txt'}: cannot write "
                                          f"in directory {folder} (read-only or immutable)")
    assert os.listdir(folder) == []


def test_unwritable_directory_is_refused_before_the_work(setup, tmp_path, monkeypatch):
    """Where chattr is not available: os.access says the directory is not writable."""
    folder = tmp_path / "folder"
    folder.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if (
        mode & os.W_OK and os.fspath(path) == str(folder)) else real_access(path, mode, **kw))
    for args in commands(setup, folder / "out.txt"):
        assert "cannot write in directory" in error_line(run(*args)), args


def test_output_under_a_regular_file_is_refused_before_the_work(setup, tmp_path):
    not_a_dir = tmp_path / "plain.txt"
    not_a_dir.write_text("")
    for args in commands(setup, not_a_dir / "out.txt"):
        assert error_line(run(*args)) == (f"align: error: {not_a_dir / 'out.txt'}: output "
                                          f"directory does not exist"), args


def test_check_writable_accepts_stdout_new_and_existing_files(tmp_path):
    check_writable(None)
    check_writable("-")
    check_writable(str(tmp_path / "new.txt"))
    (tmp_path / "old.txt").write_text("x")
    check_writable(str(tmp_path / "old.txt"))
    with pytest.raises(AlignerError, match="is a directory"):
        check_writable(str(tmp_path))


def test_atomic_output_turns_a_failed_temporary_file_into_one_error(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    path = tmp_path / "out.txt"
    with pytest.raises(AlignerError, match=f"^{path}: cannot write a file in {tmp_path}: "
                                           f"Permission denied$"):
        with atomic_output(str(path)) as out:
            out.write("never\n")
    assert not path.exists()


def test_atomic_output_turns_a_failed_rename_into_one_error(tmp_path, monkeypatch):
    path = tmp_path / "out.txt"
    path.write_text("old\n")

    def refuse(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(AlignerError, match=f"^{path}: cannot replace the file: Operation not "
                                           f"permitted$"):
        with atomic_output(str(path)) as out:
            out.write("new\n")
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["out.txt"]          # the temporary file is gone


def test_atomic_output_over_an_immutable_file_is_one_error(tmp_path, immutable):
    path = tmp_path / "out.txt"
    path.write_text("old\n")
    immutable(path)
    with pytest.raises(AlignerError, match="cannot replace the file"):
        with atomic_output(str(path)) as out:
            out.write("new\n")
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["out.txt"]


def test_atomic_output_refuses_binary_to_stdout():
    with pytest.raises(AlignerError, match="binary output cannot go to stdout"):
        with atomic_output("-", "wb"):
            pass


# ------------------------------------------------------------------------------------------
# align show: too long a pair, too large a figure
# ------------------------------------------------------------------------------------------

def test_show_refuses_a_pair_longer_than_the_model_limit(setup, tmp_path):
    pytest.importorskip("matplotlib")
    root, directory, src, tgt, _ = setup
    long_src, long_tgt = tmp_path / "long.src", tmp_path / "long.tgt"
    long_src.write_text("short line\n" + " ".join(["s1"] * 5000) + "\n")
    long_tgt.write_text("short line\nt1 t2\n")
    out = tmp_path / "pair.png"
    line = error_line(run("show", directory, "-s", long_src, "-t", long_tgt, "-n", 2, "-o", out,
                          "--device", "cpu"))
    assert line == (f"align: error: {long_src}:2: the pair takes 5001 positions, more than the "
                    f"model's limit of 16: too long to draw")
    assert not out.exists()


def test_show_refuses_a_figure_too_large_to_draw(setup, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import aligner.links.plot
    root, directory, src, tgt, _ = setup
    out = tmp_path / "pair.png"
    args = ["show", directory, "-s", src, "-t", tgt, "-n", 2, "-o", out, "--device", "cpu",
            "--dpi", 1200]
    monkeypatch.setattr(aligner.links.plot, "MAX_PIXELS", 10 ** 6)
    line = error_line(run(*args))
    assert line.startswith(f"align: error: {src}:2: a figure of ") and \
        "pixels is too large to draw" in line and "lower --dpi" in line
    assert not out.exists()
    monkeypatch.undo()
    assert run(*args).exit_code == 0 and out.exists()    # the real limit allows it


def test_draw_alignments_refuses_a_figure_wider_than_matplotlib_draws(tmp_path):
    pytest.importorskip("matplotlib")
    from aligner.links.plot import draw_alignments
    words = [f"w{k}" for k in range(2100)]                  # 0.32 in * 2100 * 100 dpi > 2**16
    with pytest.raises(AlignerError, match="too large to draw"):
        draw_alignments(open(tmp_path / "x.png", "wb"), [("m", np.zeros((1, 2100)))], ["a"],
                        words)


# ------------------------------------------------------------------------------------------
# align extract --soft: never to stdout, never half written
# ------------------------------------------------------------------------------------------

def test_soft_to_stdout_is_refused_up_front_and_writes_nothing(setup, tmp_path):
    root, _, src, tgt, _ = setup
    out = tmp_path / "out.txt"
    line = error_line(run("extract", root / "no-such-model", "-s", src, "-t", tgt, "-o", out,
                          "--soft", "-"))
    assert line == ("align: error: --soft -: the .npz matrices cannot go to stdout; give a "
                    "file name")
    assert not out.exists()


def test_soft_and_output_on_the_same_file_is_refused(setup, tmp_path):
    root, directory, src, tgt, _ = setup
    out = tmp_path / "both"
    assert "-o and --soft name the same file" in error_line(
        run("extract", directory, "-s", src, "-t", tgt, "-o", out, "--soft", out))
    assert not out.exists()


def test_a_failed_soft_extraction_writes_neither_file(setup, tmp_path, monkeypatch):
    import aligner.extract.inference
    root, directory, src, tgt, _ = setup
    out, soft = tmp_path / "out.txt", tmp_path / "soft.npz"

    def fail(*args, **kwargs):
        raise AlignerError("soft matrices failed")

    monkeypatch.setattr(aligner.extract.inference, "soft_alignments", fail)
    # -q: no progress bars (the alignment itself runs before the failure)
    assert error_line(run("extract", directory, "-s", src, "-t", tgt, "-o", out, "--soft",
                          soft, "--device", "cpu", "-q")) == "align: error: soft matrices failed"
    assert os.listdir(tmp_path) == []


def test_a_failed_pharaoh_write_leaves_no_soft_file(setup, tmp_path, monkeypatch):
    import aligner.formats
    root, directory, src, tgt, _ = setup
    out, soft = tmp_path / "out.txt", tmp_path / "soft.npz"

    def fail(*args, **kwargs):
        raise AlignerError("writing failed")

    monkeypatch.setattr(aligner.formats, "write_pharaoh", fail)
    error_line(run("extract", directory, "-s", src, "-t", tgt, "-o", out, "--soft", soft,
                   "--device", "cpu", "-q"))
    assert os.listdir(tmp_path) == []


def test_extract_writes_both_files_when_all_goes_well(setup, tmp_path):
    root, directory, src, tgt, _ = setup
    out, soft = tmp_path / "out.txt", tmp_path / "soft.npz"
    result = run("extract", directory, "-s", src, "-t", tgt, "-o", out, "--soft", soft,
                 "--device", "cpu", "-q")
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 3
    assert sorted(np.load(soft)) == sorted(f"{d}_{k}" for d in ("fwd", "rev") for k in range(3))
    assert sorted(os.listdir(tmp_path)) == ["out.txt", "soft.npz"]


# ------------------------------------------------------------------------------------------
# -O KEY=VALUE: validated like every option
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("option, message", [
    ("layer=abc", "-O layer=abc: 'abc' is not a valid integer."),
    ("layer=2.5", "-O layer=2.5: '2.5' is not a valid integer."),
    ("layer=true", "-O layer=true: 'true' is not a valid integer."),
    ("sgd-lr=fast", "-O sgd-lr=fast: 'fast' is not a valid float."),
    ("sgd_steps=-1", "-O sgd_steps=-1: -1 is not in the range x>=0."),
    ("init=zeros", "-O init=zeros: 'zeros' is not one of 'forward', 'random'."),
    ("colour=red", "-O colour=red: unknown method option 'colour' (known: init, layer, seed, "
                   "sgd_lr, sgd_steps, shortlist)"),
    ("layer", "-O expects KEY=VALUE, got 'layer'"),
])
def test_bad_method_options_are_one_line_before_the_work(setup, tmp_path, option, message):
    root, _, src, tgt, _ = setup
    nope = root / "no-such-model"
    out = tmp_path / "out.txt"
    for command in ("extract", "show"):
        if command == "show":
            pytest.importorskip("matplotlib")
        line = error_line(run(command, nope, "-s", src, "-t", tgt, "-o", out, "-O", option))
        assert line == f"align: error: {message}", command
    assert not out.exists()


def test_a_good_method_option_equals_its_dedicated_option(setup):
    root, directory, src, tgt, _ = setup
    base = ["extract", directory, "-s", src, "-t", tgt, "--device", "cpu", "-q"]
    by_option = run(*base, "-O", "layer=1")
    assert by_option.exit_code == 0, by_option.output
    assert by_option.output == run(*base, "--layer", "1").output


def _model_files(directory):
    """{relative path: bytes} of every file in a model directory."""
    return {str(path.relative_to(directory)): path.read_bytes()
            for path in sorted(directory.rglob("*")) if path.is_file()}


def test_an_output_inside_the_model_directory_is_refused_and_the_model_kept(setup, tmp_path):
    """-o / --soft / --link-probs of extract, -o of show and translate, and align run's -o in
    its own --model-dir: each would replace a file of the model (config.json, weights,
    vocabularies) and exit 0; they are refused up front, links to the directory included."""
    root, directory, src, tgt, _ = setup
    before = _model_files(directory)
    link = tmp_path / "link"                       # another name of the model directory
    link.symlink_to(directory)
    pointer = tmp_path / "pointer.txt"             # a file name that leads into it
    pointer.symlink_to(directory / "config.json")
    cases = [
        ("-o", ["extract", directory, "-s", src, "-t", tgt, "-o", directory / "config.json"]),
        ("-o", ["extract", directory, "-s", src, "-t", tgt, "-o",
                directory / "fwd" / "params.best.pt"]),
        ("--soft", ["extract", directory, "-s", src, "-t", tgt, "-o", tmp_path / "out",
                    "--soft", directory / "vocab.src.json"]),
        ("--link-probs", ["extract", directory, "-s", src, "-t", tgt, "-o", tmp_path / "o2",
                          "--link-probs", directory / "rev" / "params.best.pt"]),
        ("-o", ["extract", directory, "-s", src, "-t", tgt, "-o", link / "config.json"]),
        ("-o", ["extract", link, "-s", src, "-t", tgt, "-o", directory / "new.align"]),
        ("-o", ["extract", directory, "-s", src, "-t", tgt, "-o", pointer]),
        ("-o", ["show", directory, "-s", src, "-t", tgt, "-o", directory / "prep.json"]),
        ("-o", ["translate", directory, "-i", src, "-o", directory / "vocab.tgt.json"]),
    ]
    for option, args in cases:
        line = error_line(run(*args))
        assert f"{option} lies inside the model directory" in line, (args, line)
    assert _model_files(directory) == before
    model = tmp_path / "rd"
    line = error_line(run("run", "-s", src, "-t", tgt, "--model-dir", model, "-o",
                          model / "config.json", "--max-updates", "1"))
    assert "-o lies inside the model directory" in line and not model.exists()
    # the model still aligns
    run("extract", directory, "-s", src, "-t", tgt, "-o", tmp_path / "after.align", "-q")
    assert len((tmp_path / "after.align").read_text().splitlines()) == 3


@pytest.mark.parametrize("option,args", [
    ("-o", ["symmetrize", "-f", "{gold}", "-r", "{gold}", "-o", ""]),
    ("-o", ["extract", "{model}", "-s", "{src}", "-t", "{tgt}", "-o", ""]),
    ("--soft", ["extract", "{model}", "-s", "{src}", "-t", "{tgt}", "--soft", ""]),
    ("--link-probs", ["extract", "{model}", "-s", "{src}", "-t", "{tgt}", "--link-probs", ""]),
    ("-o", ["show", "{model}", "-s", "{src}", "-t", "{tgt}", "--line", "1", "-o", ""]),
    ("-o", ["translate", "{model}", "-i", "{src}", "-o", ""]),
    ("--sweep", ["score-aer", "-g", "{gold}", "-a", "{gold}", "--sweep", ""]),
    ("-o", ["run", "-s", "{src}", "-t", "{tgt}", "-o", ""]),
    ("-f", ["run", "-s", "{src}", "-t", "{tgt}", "-f", ""]),
    ("-r", ["run", "-s", "{src}", "-t", "{tgt}", "-r", ""]),
    ("--soft", ["run", "-s", "{src}", "-t", "{tgt}", "--soft", ""]),
    ("-o/--model-dir", ["train", "-s", "{src}", "-t", "{tgt}", "-o", ""]),
    ("--model-dir", ["run", "-s", "{src}", "-t", "{tgt}", "--model-dir", ""]),
    ("--workdir", ["demo", "--workdir", ""]),
])
def test_an_empty_output_name_is_one_line_naming_the_option(setup, tmp_path, option, args):
    """`-o ''` (an unset shell variable) was 'align: error: : cannot replace the file', after
    the work: every output option refuses an empty name up front, one line naming the option,
    nothing written in the working directory."""
    import sys
    root, directory, src, tgt, gold = setup
    names = {"model": directory, "src": src, "tgt": tgt, "gold": gold}
    work = tmp_path / "cwd"
    work.mkdir()
    root_dir = str(Path(__file__).resolve().parent.parent)
    done = subprocess.run([sys.executable, "-m", "aligner",
                           *[a.format(**names) for a in args]], cwd=work, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": root_dir})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [f"align: error: {option}: empty "
                                                f"{'directory' if 'dir' in option else 'file'} "
                                                f"name"]
    assert os.listdir(work) == []
