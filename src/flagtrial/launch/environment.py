"""Environment files: the KEY=VALUE lines an EnvironmentFile= names, as the server's
environment gets them (comments and blank lines skipped, one pair of quotes removed)."""

from __future__ import annotations


def parse_env_file(text: str) -> dict[str, str]:
    env = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, value = line.split("=", 1)
        env[key.strip()] = value.strip().strip("\"'")
    return env
