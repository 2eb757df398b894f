# Two commands do all the set-up on a fresh machine:
#   make demo   install, generate the seed A dataset, analyse it, benchmark it on the embedded simulator
#   make test   install test needs and run the whole test suite (fast tests, then the real-engine
#               conformance suite against vLLM's CPU build: tests/real_engine)
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
DEMO = demo-out

.PHONY: demo test test-engine lint install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[plot,fast]'

install-test: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,fast]'  # the suite runs on uvloop, as installed users do

demo: install
	$(BIN)/mmdatagen pool --output $(DEMO)/seed_a.jsonl --force
	$(BIN)/mmdatagen analyze $(DEMO)/seed_a.jsonl --model qwen3-vl-30b-a3b --cache-gb 1 --cache-gb 10
	$(BIN)/mmdatagen ab --input-file $(DEMO)/seed_a.jsonl --output-dir $(DEMO)/ab

# One server shared by the whole suite: no xdist. The engine venv and tiny model are cached under
# ~/.cache/mmdatagen (MMDATAGEN_ENGINE_VENV / MMDATAGEN_ENGINE_CACHE move them).
ENGINE_TESTS = $(BIN)/python -m pytest -p no:xdist --durations=12 tests/real_engine

test: install-test
	command -v chromium >/dev/null 2>&1 || (apt-get update && apt-get install -y chromium)  # report browser test
	$(BIN)/python -m pytest -n 2
	$(ENGINE_TESTS)

lint: install-test
	$(BIN)/ruff check mmdatagen tests benchmarks
	$(BIN)/mypy
	@worse=$$($(BIN)/radon cc -s -n D mmdatagen); test -z "$$worse" || { echo "complexity worse than C:"; echo "$$worse"; exit 1; }

test-engine: install-test
	$(ENGINE_TESTS)

clean:
	rm -rf $(DEMO) build *.egg-info
