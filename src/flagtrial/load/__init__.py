"""Closed-loop streaming load against an OpenAI-compatible server, and its summary."""

from flagtrial.load.client import RequestRecord, build_prompt
from flagtrial.load.runner import RunResult, run_level, run_level_sync
from flagtrial.load.summary import RunSummary, summarize
from flagtrial.load.workload import Workload

__all__ = [
    "RequestRecord",
    "RunResult",
    "RunSummary",
    "Workload",
    "build_prompt",
    "run_level",
    "run_level_sync",
    "summarize",
]
