# Every target creates its own virtual environment: nothing needs to be installed beforehand.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-slow bench clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/checkmate solve checkmate/data/examples/unet_train.json --budget 70% --strategy all --time-limit 60

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m slow

bench: $(STAMP)
	$(BIN)/python experiments/solve_time.py --quick

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
