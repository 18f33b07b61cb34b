# `make demo` and `make test` work on a fresh machine: they create .venv and install first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU wheel of torch first, so nothing pulls the CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[all]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m agentgrad demo

test: $(STAMP)
	$(PY) -m pytest -q -x -p no:cacheprovider

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
