"""The ``simumax`` command line: the app and its consoles here, the commands in the modules
below (registered in this order, the order ``--help`` lists them)."""

from __future__ import annotations

import re
import sys

import typer
from rich.console import Console

from simumax.errors import ConfigError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Predict LLM training time and memory.",
                  rich_markup_mode="markdown")  # docstring paragraphs rewrap to the terminal

out_console = Console()
if not out_console.is_terminal:  # piped or captured: do not squeeze tables to 80 columns
    out_console = Console(width=160)
err_console = Console(stderr=True)


def print_notes(notes: list[str]) -> None:
    """Each note as one ``note:`` line on stderr."""
    for n in notes:
        err_console.print(f"note: {n}", markup=False, highlight=False, soft_wrap=True)


def _print_version(value: bool) -> None:
    if value:
        from simumax import __version__

        out_console.print(f"simumax {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Predict LLM training time and memory."""


from simumax.cli import estimate, search, validate, calibrate, interop, presets  # noqa: E402,F401  (register the commands)
from simumax.cli.options import apply_overrides  # noqa: E402,F401  (public: tools apply --set overrides)


_SET_ITEM = re.compile(r"[A-Za-z_][\w.]*=")  # key=value: a field path, then "=" (not a file path)


def expand_sets(args: list[str]) -> list[str]:
    """``--set a=1 b=2`` as ``--set a=1 --set b=2``: the key=value words that follow a
    ``--set`` value (each a field path, then ``=``) are further overrides, as a user would
    write them; anything else (a flag, a file, ``--``) ends the run."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return out + args[i:]
        out.append(a)
        i += 1
        if a == "--set" and i < len(args):
            out.append(args[i])
            i += 1
        elif not a.startswith("--set="):
            continue
        while i < len(args) and _SET_ITEM.match(args[i]):
            out += ["--set", args[i]]
            i += 1
    return out


def main() -> None:
    """Entry point: bad input prints one line and exits 2, never a traceback."""
    try:
        app(args=expand_sets(sys.argv[1:]), standalone_mode=False)
    except ConfigError as exc:
        err_console.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise SystemExit(2) from None
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        raise SystemExit(1) from None
    except OSError as exc:  # a file or folder the OS refused: one line, never a traceback
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        err_console.print(f"error: {exc.strerror or exc}{where}", markup=False, highlight=False, soft_wrap=True)
        raise SystemExit(2) from None
    except Exception as exc:  # click usage errors (typer may vendor its own click)
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            raise SystemExit(exc.exit_code) from None
        raise

