# The two entry points of the README. Both install what they need first (scripts/install.sh:
# idempotent, CPU or GPU stack chosen by the hardware).
#   make serve [ARGS="--port 30000 --kv-budget 1.0"]
#   make test  [PYTEST_ARGS="-k flags"]
#   make lint   (ruff: the linter, and the formatter in check mode; `make format` applies it)
VENV ?= .venv
ARGS ?=
PYTEST_ARGS ?=

.PHONY: serve test lint format

serve:
	SGLANG_PASK_VENV=$(abspath $(VENV)) scripts/install.sh serve
	$(VENV)/bin/python -m sglang_pask.launch_server $(ARGS)

test:
	SGLANG_PASK_VENV=$(abspath $(VENV)) scripts/install.sh test
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

lint:
	SGLANG_PASK_VENV=$(abspath $(VENV)) scripts/install.sh test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format:
	SGLANG_PASK_VENV=$(abspath $(VENV)) scripts/install.sh test
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .
