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

.PHONY: test unit unit-lowest e2e lint typecheck venv demo bench control-plane clean docs release

# The venv holds exactly requirements-test.lock (every version pinned, every file's hash checked), then the
# project itself without resolving anything more. docs/development.md#dependencies says how to renew the locks.
$(BIN)/tf-extender: pyproject.toml requirements-test.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r requirements-test.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

venv: $(BIN)/tf-extender

## make unit-lowest: the unit tests on the lowest versions pyproject.toml allows (constraints-lowest.txt)
LOWEST_VENV ?= .venv-lowest
unit-lowest:
	rm -rf $(LOWEST_VENV)
	$(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_VENV)/bin/pip install --quiet -c constraints-lowest.txt -e '.[test]'
	$(LOWEST_VENV)/bin/pip list --format=freeze | grep -i -E '^(aiohttp|orjson|httptools|numpy|kubernetes|cryptography|pydantic|prometheus.client|pyyaml|uvloop)=='
	$(LOWEST_VENV)/bin/pytest -m "not e2e" $(XDIST) $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .

typecheck: venv
	$(BIN)/mypy extender webhook certs kubectl_tf tools

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

## make release [VERSION=x.y.z]: image for linux/amd64 and linux/arm64 (buildah, no emulation), chart package
## (helm), wheel, SBOM and SHA256SUMS of one version, in dist/, each signed where cosign is installed
## (COSIGN_KEY, else keyless); docs/release.md. VERSION defaults to pyproject.toml's. BASE_IMAGE=... builds
## the image from another base; PLATFORMS="linux/arm64" builds only those.
release: venv
	$(BIN)/python -m tools.release $(if $(VERSION),--version $(VERSION),) \
	  --helm "$$(bash tests/harness/build-control-plane.sh helm | sed -n 's/^export TF_BIN_HELM=//p')" \
	  $(if $(BASE_IMAGE),--base-image $(BASE_IMAGE),) $(foreach p,$(PLATFORMS),--platform $(p))

clean:
	rm -rf $(VENV) $(LOWEST_VENV) build dist *.egg-info .mypy_cache .pytest_cache .ruff_cache
