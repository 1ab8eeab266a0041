# Two entry points: `make demo` (train, analyse, write report/index.html) and `make test`.
PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip
DOCS_SITE   ?= site

.PHONY: demo test install bench docs clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -c constraints.txt -e ".[test,ray,dask,flower,hf]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) examples/demo.py --out report

# The test command: the suite (the Flower integration included), then the strict docs build.
test: install
	$(PY) -m pytest tests
	$(MAKE) --no-print-directory docs

bench: install
	$(PIP) install -c constraints.txt -e ".[bench]"
	$(PY) benchmarks/run_all.py

# Documentation: installs the docs extra once, then builds docs/ strictly (a broken link fails).
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml constraints.txt
	$(PIP) install -c constraints.txt -e ".[docs]"
	touch $@

docs: $(VENV)/.docs-installed
	$(VENV)/bin/mkdocs build --strict --quiet -d $(DOCS_SITE)

clean:
	rm -rf $(VENV) report $(DOCS_SITE)
