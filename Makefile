# Lightning developer commands. `make help` lists them.
.DEFAULT_GOAL := help
PACKAGES := packages

.PHONY: help install format lint typecheck test bench demo all

help: ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

install: ## create .venv with every package, extra and dev tool
	uv sync --all-packages

format: ## format and autofix
	uv run ruff format .
	uv run ruff check --fix .

lint: ## ruff lint and format check
	uv run ruff check .
	uv run ruff format --check .

typecheck: ## pyright strict on packages/
	uv run pyright

test: ## the test suite (same command as CI)
	uv run pytest

bench: ## the benchmarks (see benchmarks/README.md)
	uv run python benchmarks/store_throughput.py
	uv run python benchmarks/gateway_overhead.py
	uv run python benchmarks/engine_batching.py
	uv run python benchmarks/trainer_step.py

demo: ## the main job: train the tiny calculator agent on CPU
	uv run lightning-rl demo

all: format lint typecheck test ## everything, in order
