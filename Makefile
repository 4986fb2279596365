# tensor-fusion-extender developer commands.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# The suite in parallel (pytest-xdist): each worker is a session with a control plane of its own and runs
# whole modules, longest first (the order is in tests/conftest.py). Most of the suite waits on timers
# (Karpenter's, the Cluster Autoscaler's, the demo's), so there are more workers than cores. JOBS=0: serial.
JOBS ?= 4
XDIST := $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadfile --no-loadscope-reorder)

.PHONY: test unit e2e lint typecheck venv demo bench control-plane clean docs

$(BIN)/tf-extender: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

venv: $(BIN)/tf-extender

lint: venv
	$(BIN)/ruff check .

typecheck: venv
	$(BIN)/mypy extender webhook certs tools

unit: venv
	$(BIN)/pytest -m "not e2e" $(XDIST) $(PYTEST_ARGS)

## make docs: regenerate docs/reference/flags.md and metrics.md from the parsers and metric registries, and the
## chart's README.md and values.schema.json from its values.yaml
docs: venv
	$(BIN)/python -m tools.docgen

control-plane:
	bash tests/harness/build-control-plane.sh

e2e: venv control-plane
	$(BIN)/pytest -m e2e $(XDIST) $(PYTEST_ARGS)

## make test: lint, type-check, unit tests and the end-to-end suite on a real control plane
test: lint typecheck control-plane
	$(BIN)/pytest $(XDIST) $(PYTEST_ARGS)

## make demo [ONCE=1]: local control plane, sample GPU cluster and pods, a placement table
demo: venv control-plane
	$(BIN)/python -m demo $(if $(ONCE),--once,)

## make bench [QUICK=1]: benchmarks, results in bench/results/latest.md
bench: venv control-plane
	$(BIN)/python -m bench.run $(if $(QUICK),--quick,)

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
