# `make demo` runs the main job on the embedded default; `make test` runs lint, types and the test suite.
# Both create or refresh the virtualenv first (torch pinned through constraints.txt).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
SOURCES := $(shell find searchgym envs agents -name '*.py' -o -name '*.json' 2>/dev/null)

.PHONY: venv demo test lint typecheck unit clean

$(STAMP): setup.cfg pyproject.toml constraints.txt $(SOURCES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# strict editable mode: a tree of links, so mypy and tools see the searchgym.envs/agents mapping
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[all,dev]' --config-settings editable_mode=strict
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(BIN)/searchgym demo

lint: venv
	$(BIN)/ruff check searchgym envs agents tests scripts
	$(BIN)/ruff format --check searchgym envs agents tests scripts

typecheck: venv
	$(BIN)/mypy -p searchgym

unit: venv
	$(BIN)/pytest

test: lint typecheck unit

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
