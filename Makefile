# The README's two commands (demo, test). Both work from a fresh clone with nothing
# installed: they create .venv if needed, install loaderkit with its extras under
# constraints.txt, and re-install only when pyproject.toml or constraints.txt change.
# Also: docs (serve the documentation site locally), dist (build the sdist and wheel).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The stamp's name carries the hash of what the install depends on, so editing
# either file makes the next run re-install, and an unchanged tree skips it.
HASH   := $(shell cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
STAMP  := $(VENV)/.installed-$(HASH)

.PHONY: setup demo test lint typecheck pytest docs docs-build dist clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,vision,examples,bench]'
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: setup
	$(BIN)/loaderkit demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy loaderkit

# Two test processes (the CI machine's cores); a file's tests stay in one process, so its
# module fixtures (a moto server, recorded runs) are built once. PYTEST_WORKERS=0: serial.
# --no-loadscope-reorder: files are handed out in tests/conftest.py's order (the long
# distributed ones first), not xdist's default of the files with the most tests first.
PYTEST_WORKERS ?= 2
XDIST = -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

pytest: setup
	$(BIN)/python -m pytest $(if $(filter 0,$(PYTEST_WORKERS)),,$(XDIST))

# The documentation site (mkdocs.yml): built offline; --strict turns every warning (a
# broken link, an API name that does not resolve, a docstring griffe cannot read) into
# a failure.
docs-build: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# An sdist and a wheel in dist/, checked as PyPI would (tests/test_packaging.py installs
# the wheel into a fresh venv and runs the quick start).
dist: setup
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*

test: lint typecheck pytest docs-build

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site dist build
