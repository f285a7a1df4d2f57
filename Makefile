# chunkyard — the two commands: `make ingest` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CORPUS ?= corpus
OUT    ?= chunks

.PHONY: install ingest test lint bench bench-watch bench-adapters fuzz watch clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,langchain,llamaindex]'  # the adapters' tests need both frameworks
	touch $(STAMP)

install: $(STAMP) ## create .venv and install chunkyard with its dev tools

ingest: $(STAMP) ## chunk corpus/ into chunks/
	$(BIN)/chunkyard ingest $(CORPUS) --out $(OUT)

watch: $(STAMP) ## keep chunks/ current while corpus/ is edited
	$(BIN)/chunkyard watch $(CORPUS) --out $(OUT)

test: $(STAMP) ## lint, type-check and run every test
	$(BIN)/ruff check pipeline tests bench
	$(BIN)/mypy pipeline
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check pipeline tests bench
	$(BIN)/ruff format --check pipeline
	$(BIN)/mypy pipeline

bench: $(STAMP) ## throughput against the splitters people use (pip install -e '.[bench]' for the peers)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

bench-watch: $(STAMP) ## save → chunk files current, p50/p95, for a 20 KB and a 700 KB document
	$(BIN)/python bench/watch_latency.py

bench-adapters: $(STAMP) ## the LangChain and LlamaIndex syncs over a real corpus: first, no-op, one edit
	$(BIN)/python bench/sync_adapters.py $(BENCH_ARGS)

fuzz: $(STAMP) ## a long fuzz run of the pipeline on hostile Markdown
	HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest -q tests/test_fuzz.py

clean:
	rm -rf $(OUT) .pytest_cache .mypy_cache .ruff_cache .hypothesis
