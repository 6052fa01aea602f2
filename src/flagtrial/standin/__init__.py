"""Stand-in servers for SGLang and vLLM, for machines without a GPU.

`python -m flagtrial.standin.sglang [sglang flags]` and
`python -m flagtrial.standin.vllm [MODEL] [vllm flags]` parse their flags with the flag table
of the engine wheel installed for the interpreter (so a flag that version lacks stops them at
start, as it stops the real server), print the engine's startup log lines, and serve the
engine's endpoints on 127.0.0.1: readiness, server info, models, metrics, and streamed
completions of exactly `max_tokens` tokens. The environment declares what a GPU server would
know by itself: `FLAGTRIAL_STANDIN_GPU` (e.g. `sm120:96`), `FLAGTRIAL_STANDIN_MODEL`
(overrides of `declared.Model`), `FLAGTRIAL_STANDIN_TOKEN_DELAY_S` (seconds per generated
token) and `FLAGTRIAL_STANDIN_START_S` (seconds of 503 before ready). Each engine is its own
module so that everything after the program words is the engine's own command line.
"""
