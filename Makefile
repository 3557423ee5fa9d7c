# One-command set-up and the commands the README names.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: setup test test-quick lint demo clean

setup: $(BIN)/mmlinks

$(BIN)/mmlinks: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $@

test: setup
	$(BIN)/python -m pytest -q

test-quick: setup
	$(BIN)/python -m pytest -q -m "not slow"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

demo: setup
	$(BIN)/mmlinks demo

clean:
	rm -rf $(VENV) mmlinks-demo
