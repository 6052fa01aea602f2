"""Closed-loop streaming load against an OpenAI-compatible server, and its summary.

Import the submodule that holds what you need: `load.workload` (the settings' model) must not
pull in httpx and numpy.
"""
