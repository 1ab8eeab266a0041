# Two entry points: `make demo` (train, analyse, write report/index.html) and `make test`.
PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip
# The Flower integration (fl.flower) has its own environment: flwr[simulation] pins ray 2.55.1 and
# protobuf < 7, which clash with constraints.txt (see constraints-flower.txt).
FLOWER_VENV ?= .venv-flower
DOCS_SITE   ?= site

.PHONY: demo test test-flower install bench docs clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -c constraints.txt -e ".[test,ray,dask]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) examples/demo.py --out report

# The test command: the suite, then the Flower integration in its own venv, then the strict docs build.
test: install
	$(PY) -m pytest tests
	$(MAKE) --no-print-directory test-flower docs

bench: install
	$(PIP) install -c constraints.txt -e ".[bench]"
	$(PY) benchmarks/run_all.py

# Documentation: installs the docs extra once, then builds docs/ strictly (a broken link fails).
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml constraints.txt
	$(PIP) install -c constraints.txt -e ".[docs]"
	touch $@

docs: $(VENV)/.docs-installed
	$(VENV)/bin/mkdocs build --strict --quiet -d $(DOCS_SITE)

$(FLOWER_VENV)/.installed: pyproject.toml constraints-flower.txt
	$(PYTHON) -m venv $(FLOWER_VENV)
	$(FLOWER_VENV)/bin/python -m pip install --upgrade pip
	$(FLOWER_VENV)/bin/python -m pip install -c constraints-flower.txt -e ".[flower,test]"
	touch $@

test-flower: $(FLOWER_VENV)/.installed
	$(FLOWER_VENV)/bin/python -m pytest tests/test_flower.py

clean:
	rm -rf $(VENV) $(FLOWER_VENV) report $(DOCS_SITE)
