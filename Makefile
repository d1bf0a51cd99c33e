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

# Compile a residual CNN (BatchNorm, Dropout) for half of its checkpoint-all memory, run it, and
# compare predicted with measured peaks; then every strategy on a bundled U-Net training graph.
demo: $(STAMP)
	TF_CPU_ALLOCATOR_USE_BFC=true $(BIN)/checkmate compile --model residual_cnn --batch-size 16 \
		--input-shape 64,64,3 --budget 50% --strategy checkpoint_all,chen_greedy,checkmate_lp_rounding,checkmate_milp \
		--time-limit 20
	$(BIN)/checkmate solve checkmate/data/examples/unet_train.json --budget 70% --strategy all --time-limit 30

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m slow

bench: $(STAMP)
	$(BIN)/python experiments/solve_time.py --quick

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
