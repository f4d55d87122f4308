"""Running the `align` command line in-process in tests (click's CliRunner)."""
from __future__ import annotations

from click.testing import CliRunner, Result

from aligner.cli import main


def run(*args, ok: bool = True) -> Result:
    """`align ARGS...` (arguments str()-ed); with `ok`, assert that it exited 0."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, (result.output, result.exception)
    return result


def error_line(result: Result) -> str:
    """The one 'align: error: ...' line (and nothing like a traceback)."""
    assert result.exit_code == 1, (result.output, result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("align: error:")]
    assert len(lines) == 1, result.output
    return lines[0]
