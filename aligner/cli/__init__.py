"""The `align` command group.

Each subcommand lives in its own module of this package and only parses options and calls
library code. Modules that need torch import it inside the command function, so
`align symmetrize` and `align score-aer` never import torch.

User errors are raised as `AlignerError` anywhere in the library; the group turns them into
one line on stderr ("align: error: ...") and exit status 1, without a traceback.
"""
from __future__ import annotations

import sys

import click

from aligner import __version__
from aligner.malloc import keep_freed_memory, limit_kernel_cache
from aligner.utils import AlignerError, os_error_message


class _AlignGroup(click.Group):
    """click group that reports AlignerError, an OSError of the system (a full disk, a
    read-only or missing directory) and broken pipes without a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except AlignerError as error:
            click.echo(f"align: error: {error}", err=True)
            ctx.exit(1)
        except BrokenPipeError:  # `align ... | head`
            sys.stderr.close()
            ctx.exit(1)
        except OSError as error:
            click.echo(f"align: error: {os_error_message(error)}", err=True)
            ctx.exit(1)


@click.group(cls=_AlignGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="align")
def main() -> None:
    """Neural word alignment: train, extract, symmetrize, score."""
    keep_freed_memory()   # large tensors reuse freed memory (aligner/malloc.py)
    limit_kernel_cache()  # and oneDNN / ideep keep a few compiled kernels, not 1,024


def _register() -> None:
    """Attach the subcommands (each module defines one click command)."""
    import importlib
    import pkgutil

    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        command = getattr(module, "command", None)
        if isinstance(command, click.Command):
            main.add_command(command)


_register()
