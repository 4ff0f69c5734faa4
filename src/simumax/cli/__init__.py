"""The ``simumax`` command line: the app and its consoles here, the commands in the modules
below (registered in this order, the order ``--help`` lists them)."""

from __future__ import annotations

import typer
from rich.console import Console

from simumax.errors import ConfigError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Predict LLM training time and memory.",
                  rich_markup_mode="markdown")  # docstring paragraphs rewrap to the terminal

out_console = Console()
if not out_console.is_terminal:  # piped or captured: do not squeeze tables to 80 columns
    out_console = Console(width=160)
err_console = Console(stderr=True)


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


def main() -> None:
    """Entry point: bad input prints one line and exits 2, never a traceback."""
    try:
        app(standalone_mode=False)
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

