# The two commands of the README: `make demo` and `make test` (`make test-fast` for the fast tiers). Everything else is optional.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
DEMO_ENV := PANELFORGE_PROFILE=demo DAGSTER_HOME=$(CURDIR)/.demo/dagster_home HF_HUB_OFFLINE=1
BENCH_ENV := HF_HUB_OFFLINE=1
PORT ?= 3000

.PHONY: install demo test test-fast ui screenshots lint format bench bench-report gpu-check clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] >= (3, 11), "Python 3.11+ is required"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[dev]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(DEMO_ENV) $(BIN)/python -m jobs.demo

FAST_TIERS := tests/unit tests/stages tests/assets
# The tests start hundreds of Python processes (code servers, run workers, Ray workers, the command
# line), each importing PanelForge's modules and pytest's rewritten test modules; where
# PYTHONDONTWRITEBYTECODE is set (as container images often do) every one of them compiled those
# again. The test targets keep the bytecode caches (__pycache__/, ignored by git).
TEST_ENV := HF_HUB_OFFLINE=1 PYTHONDONTWRITEBYTECODE=

# every tier (what CI runs): the fast tiers as test-fast runs them, then tests/e2e on
# E2E_WORKERS workers, a module each at a time, the longest first (tests/conftest.py), each run's 30
# slowest tests listed; tests/e2e runs even when a fast test failed, and the target fails if either
# run did; docs/testing.md has the times (a third e2e worker on 2 cores was not reliably faster)
E2E_WORKERS ?= 2
test: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest $(FAST_TIERS) -n auto --dist loadfile --durations=30; fast=$$?; \
	$(TEST_ENV) $(BIN)/python -m pytest tests/e2e -n $(E2E_WORKERS) --dist loadfile --no-loadscope-reorder \
		--durations=30; e2e=$$?; \
	test $$fast -eq 0 && test $$e2e -eq 0

# the fast tiers (no process started: tests/conftest.py enforces it), the developer's loop: -n auto is a
# worker per core and one more (tests/conftest.py), each taking a whole test module at a time, so module
# fixtures are built once; docs/testing.md has its times
test-fast: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest $(FAST_TIERS) -n auto --dist loadfile --durations=10

# the demo's instance in `dagster dev` on http://127.0.0.1:$(PORT), offline; Ctrl-C stops all of it
ui: $(STAMP)
	$(DEMO_ENV) $(BIN)/python -m jobs.ui --port $(PORT)

# docs/screenshots/*.png from the demo's instance (run `make demo` first; needs Debian's chromium)
screenshots: $(STAMP)
	$(DEMO_ENV) $(BIN)/python -m testing.screenshots

# ruff, then the import contracts of pyproject.toml's [tool.importlinter] (docs/architecture.md: Layers)
lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

# Every CPU benchmark, each writing benchmarks/results/<name>.json (tens of minutes on 2 cores; serialization
# needs several GB of temporary disk), then docs/benchmarks.md from all the results (benchmarks/catalog.py
# lists the same commands). `make bench-report` only regenerates the page.
bench: $(STAMP)
	$(BENCH_ENV) $(BIN)/python -m benchmarks.acquisition
	$(BENCH_ENV) $(BIN)/python -m benchmarks.acquisition --rate 20 --concurrency 8 --out benchmarks/results/acquisition-rate20.json
	$(BENCH_ENV) $(BIN)/python -m benchmarks.acquisition_scale
	$(BENCH_ENV) $(BIN)/python -m benchmarks.parsing
	$(BENCH_ENV) $(BIN)/python -m benchmarks.parse_memory
	$(BENCH_ENV) $(BIN)/python -m benchmarks.entrez
	$(BENCH_ENV) $(BIN)/python -m benchmarks.embeddings
	$(BENCH_ENV) $(BIN)/python -m benchmarks.kmeans
	$(BENCH_ENV) $(BIN)/python -m benchmarks.panels
	$(BENCH_ENV) $(BIN)/python -m benchmarks.label_styles
	$(BENCH_ENV) $(BIN)/python -m benchmarks.crop_gate
	$(BENCH_ENV) $(BIN)/python -m benchmarks.panel_scales
	$(BENCH_ENV) $(BIN)/python -m benchmarks.model_inputs
	$(BENCH_ENV) $(BIN)/python -m benchmarks.panels_detector
	$(BENCH_ENV) $(BIN)/python -m benchmarks.captions
	$(BENCH_ENV) $(BIN)/python -m benchmarks.captions --baseline 4999c77 --output benchmarks/results/captions_vs_first_holdout_run.json
	$(BENCH_ENV) $(BIN)/python -m benchmarks.mining_tau
	$(BENCH_ENV) $(BIN)/python -m benchmarks.mining
	$(BENCH_ENV) $(BIN)/python -m benchmarks.longcap
	$(BENCH_ENV) $(BIN)/python -m benchmarks.serialization
	$(BENCH_ENV) $(BIN)/python -m benchmarks.training
	$(BENCH_ENV) $(BIN)/python -m benchmarks.dinov2_pad
	$(BIN)/python -m benchmarks.report

bench-report: $(STAMP)
	$(BIN)/python -m benchmarks.report

# On a GPU machine without network: every production architecture at real size, random weights
# (DINOv2-L, the DC5 DAB-DETR, Qwen2.5-VL-3B/7B, ViT-L-14 training) -> benchmarks/results/gpu_*.json,
# then the training-throughput benchmark on the GPU (ViT-B-16, both trainers) -> training_gpu.json
gpu-check: $(STAMP)
	$(BENCH_ENV) $(BIN)/python -m benchmarks.gpu_check
	$(BENCH_ENV) $(BIN)/python -m benchmarks.training --device cuda --model ViT-B-16 --batch-size 64 --workers 8 --multilevel-workers 0,8 --steps 10 --warmup-steps 2 --figures 512 --out benchmarks/results/training_gpu.json
	$(BIN)/python -m benchmarks.report

clean:
	rm -rf .demo data .pytest_cache
