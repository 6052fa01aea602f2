"""flagtrial: trial a launch-flag change on an LLM inference server."""
