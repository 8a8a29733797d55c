# The two commands of the README: `make demo` (install + the main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint clean

# torch first, pinned to the CPU wheel; then the package with a torch range that wheel satisfies.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/echo2 run --config configs/demo.toml --set run_dir=runs/demo-$$(date +%Y%m%d-%H%M%S)

test: install
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
