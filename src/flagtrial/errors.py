"""Typed errors, each with the exit code the CLI returns for it (documented in the README)."""

from __future__ import annotations


class FlagtrialError(Exception):
    """Base error: a one-line message and an exit code."""

    exit_code: int = 1


class ProjectError(FlagtrialError):
    """The project file is missing or malformed."""

    exit_code = 2


class UsageError(FlagtrialError):
    """Bad command-line use: a generation or trial that does not exist, a path that cannot
    be written, an output file that would be overwritten."""

    exit_code = 2


class SpecError(FlagtrialError):
    """A unit file or command line cannot be parsed or rendered."""

    exit_code = 3


class ChangeError(FlagtrialError):
    """A change cannot apply to the launch spec."""

    exit_code = 4


class UnknownFlagError(ChangeError):
    """A flag the engine's own parser does not know."""


class GateError(ChangeError):
    """The engine's source says the change fails at startup on this GPU."""


class TargetError(FlagtrialError):
    """The target cannot do what was asked: binary missing, host unreachable, install failed."""

    exit_code = 5


class LockHeldError(TargetError):
    """Another trial holds the target's lock."""

    exit_code = 6


class ServerNotReadyError(FlagtrialError):
    """The server crashed or did not become ready in time."""

    exit_code = 7


class LedgerError(FlagtrialError):
    """The ledger cannot be read or written."""

    exit_code = 8


class RollbackError(FlagtrialError):
    """Rolling back did not bring the server back to its known-good facts."""

    exit_code = 9
