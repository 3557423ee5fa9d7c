# One-command set-up and the commands the README names.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: setup test test-quick test-faults lint demo clean

setup: $(BIN)/mmlinks

$(BIN)/mmlinks: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $@

# Two workers, whole files per worker (module fixtures start once; the files on the session's
# trained run share one worker: tests/conftest.py). PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The whole suite, the fault-injection scenarios of tests/faults included (issue #19).
test: setup
	$(BIN)/python -m pytest -q $(XDIST)

# Without the tests marked slow (Ray, clusters, servers, training, the longer builds).
test-quick: setup
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow"

# The fault-injection scenarios (tests/faults, docs/reliability.md), alone and in one process.
test-faults: setup
	$(BIN)/python -m pytest -q -p no:xdist -m faults tests/faults

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

demo: setup
	$(BIN)/mmlinks demo

clean:
	rm -rf $(VENV) mmlinks-demo

# Dagster UI on http://127.0.0.1:3000 with every asset, check, schedule and sensor; SQLite
# instance in .dagster/, data under data/ (docs/orchestration.md).
.PHONY: dagster
dagster: setup
	mkdir -p .dagster
	test -f .dagster/dagster.yaml || cp orchestration/dagster-local.yaml .dagster/dagster.yaml
	DAGSTER_HOME=$(CURDIR)/.dagster MMLINKS_DAGSTER_CONFIG=$${MMLINKS_DAGSTER_CONFIG:-orchestration/dagster-local.json} \
		$(BIN)/dagster dev
