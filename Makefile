# The two commands of the README: `make demo` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
DEMO_ENV := PANELFORGE_PROFILE=demo DAGSTER_HOME=$(CURDIR)/.demo/dagster_home HF_HUB_OFFLINE=1
PORT ?= 3000

.PHONY: install demo test ui screenshots lint format bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] >= (3, 11), "Python 3.11+ is required"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[dev]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(DEMO_ENV) $(BIN)/python -m jobs.demo

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest

# the demo's instance in `dagster dev` on http://127.0.0.1:$(PORT), offline; Ctrl-C stops all of it
ui: $(STAMP)
	$(DEMO_ENV) $(BIN)/python -m jobs.ui --port $(PORT)

# docs/screenshots/*.png from the demo's instance (run `make demo` first; needs Debian's chromium)
screenshots: $(STAMP)
	$(DEMO_ENV) $(BIN)/python -m testing.screenshots

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

bench: $(STAMP)
	$(BIN)/python -m benchmarks.acquisition
	$(BIN)/python -m benchmarks.acquisition_scale
	$(BIN)/python -m benchmarks.parsing
	$(BIN)/python -m benchmarks.entrez
	$(BIN)/python -m benchmarks.embeddings
	$(BIN)/python -m benchmarks.kmeans
	$(BIN)/python -m benchmarks.serialization

clean:
	rm -rf .demo data .pytest_cache
