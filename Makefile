# tokenpath: every target creates the virtual environment it needs.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
DEMO_DEFAULT_ARGS ?= --duration 45

.PHONY: venv demo test lint typecheck bench system-deps clean dashboards

$(STAMP): pyproject.toml setup.py collector/receivers/_otlp_native.c
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(VENV)/bin/tokenpath demo $(if $(ARGS),$(ARGS),$(DEMO_DEFAULT_ARGS))

system-deps:
	@bash scripts/install-system-deps.sh

lint: venv
	$(VENV)/bin/ruff check .
	VENV=$(VENV) bash scripts/typecheck.sh

typecheck: venv
	VENV=$(VENV) bash scripts/typecheck.sh

test: system-deps venv lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

bench: venv
	$(PY) -m bench $(ARGS)

dashboards: venv
	$(VENV)/bin/tokenpath dashboards build

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
	find collector -name "_otlp_native*.so" -delete
