# Newcomer path: `make demo` and `make test` work on a fresh machine with only
# python3 (>= 3.11) and make; everything else is installed into .venv here.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup lint test demo demo-engine bench bench-overhead soak fuzz clean redis-server postgresql

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,engine,otel,native]'
	touch $(STAMP)

# The hot pure core compiled in place with mypyc when a C compiler is present
# (one line says so when not: then everything runs pure); nothing to do when
# the build matches the sources (gateway/native.py, gateway/tools/build_native.py).
setup: $(STAMP)
	@$(BIN)/python -m gateway.tools.build_native

lint: setup
	$(BIN)/ruff check gateway tests bench
	$(BIN)/ruff format --check gateway tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# The limits-store tests run real redis-server instances of their own.
redis-server:
	@bash tests/support/ensure-redis-server.sh

# The state-store tests run real PostgreSQL servers of their own.
postgresql:
	@bash tests/support/ensure-postgresql.sh

# The whole suite against the build `make setup` made (compiled where a C
# compiler is), then the compiled modules' own tests against the pure-Python
# modules (GATEWAY_PURE=1); tests/test_native.py proves which build each ran.
PURE_TESTS := tests/test_native.py tests/core tests/apis tests/pipeline tests/fuzz tests/admission tests/ratelimit

test: lint redis-server postgresql
	@build=$$($(BIN)/python -m gateway.tools.build_native --expect); \
	echo "make test: the whole suite on the $$build build"; \
	GATEWAY_EXPECT_BUILD=$$build $(BIN)/pytest -q -p no:cacheprovider || exit $$?; \
	if [ "$$build" != pure ]; then \
	  echo "make test: the compiled modules' tests on the pure-Python build"; \
	  GATEWAY_PURE=1 GATEWAY_EXPECT_BUILD=pure $(BIN)/pytest -q -p no:cacheprovider $(PURE_TESTS); \
	fi

demo: setup
	$(BIN)/mistralrs-gateway demo

# The same with real inference: the mistral.rs engine (adapter, test equipment)
# on a generated random-weight model; its text means nothing.
demo-engine: setup
	$(BIN)/mistralrs-gateway demo --engine

# The scenarios direct, through the gateway and through a plain nginx (for
# reference), the per-stage CPU budget of one streamed request (py-spy), then
# what the state costs per request on SQLite vs PostgreSQL, then what a
# release costs, then an image and a speech request's CPU and peak RSS
# (bench/README.md).
bench: setup postgresql
	@bash bench/ensure-nginx.sh
	$(BIN)/python -m pip install -q -e '.[profile]'
	$(BIN)/python -m bench.run --nginx
	$(BIN)/python -m bench.budget
	$(BIN)/python -m bench.bench_instructions
	$(BIN)/python -m bench.bench_state
	$(BIN)/python -m bench.bench_release
	$(BIN)/python -m bench.bench_agents
	$(BIN)/python -m bench.bench_images_speech

# The published overhead benchmark (docs/performance.md): open-loop load at
# fixed rates, direct vs the gateway vs nginx vs (optional) the LiteLLM proxy,
# the proxy pinned alone on one CPU. LiteLLM is installed into its own venv
# under bench/ when pip can; never a test dependency.
bench-overhead: setup
	@bash bench/ensure-nginx.sh
	@bash bench/ensure-litellm.sh
	$(BIN)/python -m bench.overhead

soak: setup
	GATEWAY_SOAK=long $(BIN)/pytest -q -p no:cacheprovider tests/test_soak.py -s

fuzz: setup redis-server postgresql
	GATEWAY_FUZZ=long $(BIN)/pytest -q -p no:cacheprovider -m fuzz -s --hypothesis-show-statistics

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis .import_linter_cache var build
	rm -f gateway/_native.json
	find gateway -name '*.so' -delete
