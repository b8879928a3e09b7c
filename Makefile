# The README's two commands: `make demo` (the quickstart loop) and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS := dev,postgres,notebooks,dashboards,nvml

.PHONY: setup lock tools stack stack-stop demo demo-stop test test-unit test-integration lint clean

$(BIN)/goodput: pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt pip
	$(BIN)/pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	@touch $@

setup: $(BIN)/goodput  ## Python environment, pinned by constraints.txt (the stack installs its Debian packages itself)

lock:  ## upgrade .venv to the newest versions pyproject.toml allows and pin them (then make test)
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --upgrade -e '.[$(EXTRAS)]'
	{ sed -n '/^#/p' constraints.txt; $(BIN)/pip freeze --all --exclude-editable --exclude setuptools; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	@touch $(BIN)/goodput

tools:  ## Debian packages the tests drive: the stack's (promtool, amtool, Slurm, …) and Chromium
	bash compose/local/stack.sh install-test-tools

stack: setup  ## start the local stack (real Prometheus, Alertmanager, Slurm)
	$(BIN)/goodput stack up

stack-stop:
	bash compose/local/stack.sh stop

demo: setup  ## the quickstart: the whole loop on one machine
	$(BIN)/goodput demo

demo-stop:  # the stack's own stop only where the demo's could not run
	$(BIN)/goodput demo stop || bash compose/local/stack.sh stop

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check goodput catalogue alertdsl clients exporters detector recovery bench dashboards tests
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

test-unit: setup tools
	$(BIN)/pytest -m "not integration and not browser" -q -n 2

test-integration: tools stack
	GOODPUT_KEEP_STACK=1 $(BIN)/pytest -m "integration or browser" -q

test: lint  ## lint, types, unit tests, then integration tests against the real stack
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory test-unit && $(MAKE) --no-print-directory test-integration; rc=$$?; \
	echo "test time: $$(( $$(date +%s) - start ))s"; exit $$rc

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
