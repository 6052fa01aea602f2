"""Command-line face: parse, call, render. Exit codes are documented in the README.

One module per group of commands, each registering on `common.app` when imported (in the
order `--help` lists them); a command imports the library it calls when it runs."""

from __future__ import annotations

import importlib
import sys

from rich.markup import escape

# Typer vendors click: its usage errors are these classes.
from typer._click.exceptions import ClickException, NoArgsIsHelpError

from flagtrial import ui
from flagtrial.cli.common import app
from flagtrial.errors import FlagtrialError

__all__ = ["app", "main"]

for _group in ("setup", "changes", "server", "fleet", "records", "demo"):  # the order --help lists
    importlib.import_module(f"flagtrial.cli.{_group}")


def main() -> None:
    """Every error is one line on stderr, usage errors too (Typer would draw a box)."""
    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as e:
        e.show()
        sys.exit(e.exit_code)
    except ClickException as e:
        ctx = getattr(e, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        ui.err_console.print(
            f"[red]error:[/red] {escape(ui.secrets.text(e.format_message()))}{escape(hint)}"
        )
        sys.exit(e.exit_code)
    except FlagtrialError as e:
        ui.err_console.print(f"[red]error:[/red] {ui.secrets.text(str(e))}")
        sys.exit(e.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
