"""A stand-in's command line, parsed by argparse with the flag table of the engine installed
for this interpreter (read from its source by `sourceread`, as flagtrial reads it).

A flag the installed version does not have, a bad value, an ambiguous prefix: argparse prints
the usage and `error: ...` and exits 2, at start, as the real server would.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import time
from typing import Any

from flagtrial.engines.flag_table import build_parser
from flagtrial.sourceread import extract, installed


class EngineArgs:
    """The values the command line gave, with each flag's declared default otherwise."""

    def __init__(self, engine: str, prog: str, argv: list[str], underscores: bool = False):
        self.version, folder = installed(engine)
        self.folder = folder
        self.table = extract(engine, folder)
        parser = argparse.ArgumentParser(prog=prog, allow_abbrev=True)
        build_parser(self.table["flags"], parser)
        if underscores:
            # vLLM's FlexibleArgumentParser reads `--max_num_seqs` as `--max-num-seqs`.
            argv = [_dashes(w) for w in argv]
        parsed = vars(parser.parse_args(argv))
        # Keyed by the resolved field a flag sets (0.5.10's --tp-size lands in tp_size).
        field = {spec["dest"]: spec["settings"][0] for spec in self.table["flags"]}
        self.given = {field[dest]: value for dest, value in parsed.items()}
        self.defaults = {
            field[spec["dest"]]: _literal(spec["default"]) for spec in self.table["flags"]
        }

    def get(self, field: str) -> Any:
        value = self.given.get(field)
        return self.defaults.get(field) if value is None else value

    def asked(self, field: str) -> bool:
        return self.given.get(field) is not None


def _dashes(word: str) -> str:
    if not word.startswith("--"):
        return word
    name, eq, value = word.partition("=")
    return name.replace("_", "-") + eq + value


def _literal(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def log(line: str) -> None:
    print(line, flush=True)


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def stamp(fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    return time.strftime(fmt)


def fail(message: str) -> None:
    """Die at start the way a Python server does: a traceback's last line, exit 1."""
    log("Traceback (most recent call last):")
    log('  File "<stand-in>", line 1, in <module>')
    log(message)
    sys.exit(1)
