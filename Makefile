# The two commands in the README (make demo, make test) must work from a fresh clone:
# every target that needs the environment depends on the stamp that builds it.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
EXTRAS := spark,embedded,bench,metrics,docs,test

.PHONY: venv demo test stress docs docs-build bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mlcache demo

test: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -ra $(PYTEST_ARGS)

stress: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -ra -m stress $(PYTEST_ARGS)

docs-build: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

docs: $(STAMP)
	$(VENV)/bin/mkdocs serve

bench: $(STAMP)
	$(VENV)/bin/mlcache bench all

clean:
	rm -rf $(VENV) build dist site *.egg-info
