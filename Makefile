# tokenpath: every target creates the virtual environment it needs.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# pytest-xdist: a worker a core (at most 4), a test module to a worker, in the order
# tests/conftest.py gives (the modules that start processes first).
PYTEST_PARALLEL ?= -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder
DEMO_DEFAULT_ARGS ?= --duration 45

.PHONY: venv demo test lint typecheck bench system-deps clean dashboards

# The compiled core (tokenpath/compiled.py) is built in place by its own step, with the
# environment's mypyc, and again whenever a source it may compile changes: a stale
# extension would shadow the edited .py.
CORE_STAMP := $(VENV)/.compiled-core-stamp
CORE_SOURCES := $(wildcard tokenpath/*.py collector/*.py collector/cost/*.py) \
	instrumentation/otlp_encoder.py

$(STAMP): pyproject.toml setup.py
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip "setuptools>=68" wheel
	@# setuptools warns that a folder named like the package may shadow it; here those
	@# folders are the package's sources (setup.py's package_dir), which is the point.
	PYTHONWARNINGS="ignore:Editable installation" TOKENPATH_COMPILE=0 \
		$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

$(CORE_STAMP): $(STAMP) $(CORE_SOURCES) collector/receivers/_otlp_native.c
	@echo "building the compiled core (mypyc) and the OTLP decoder (C), about a minute"
	$(PY) setup.py -q build_ext --inplace >$(VENV)/build_ext.log 2>&1 \
		|| { tail -40 $(VENV)/build_ext.log; exit 1; }
	@# mypyc leaves an extension untouched when an edit changed none of its C (a docstring,
	@# a constant folded the same): the build is current, so its files say so (the stale
	@# check in tokenpath/compiled.py compares their times with the sources').
	find collector tokenpath instrumentation -name "*.so" -exec touch {} +
	$(VENV)/bin/tokenpath --version
	@touch $(CORE_STAMP)

venv: $(STAMP) $(CORE_STAMP)

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
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

bench: venv
	$(PY) -m bench $(ARGS)

dashboards: venv
	$(VENV)/bin/tokenpath dashboards build

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
	find collector tokenpath instrumentation -name "*.so" -delete
