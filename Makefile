# grpo-cli developer tasks. `make demo` and `make test` are the README's quick start:
# each sets up the virtual environment on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch: on these machines pip takes it from local disk. Override
# TORCH_SPEC (e.g. TORCH_SPEC='torch>=2.3') to use another build.
TORCH_SPEC ?= torch==2.13.0
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: setup browser demo docs test test-fast lint snapshots dumps bench bench-quick bench-process gpu-check mutation clean

# Two stages: what `pip install .` installs (enough for `make demo`), then the development
# tools and the Ray extra (`make test` and the rest).
$(BIN)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install '$(TORCH_SPEC)'
	$(PIP) install -e .
	touch $@

$(BIN)/.installed: $(BIN)/.runtime
	$(PIP) install -e '.[dev,ray]'
	touch $@

setup: $(BIN)/.installed

# The report's browser test renders the page in Debian's Chromium: installed here where apt-get
# can (as root); elsewhere the test says it skipped and why.
APT := DEBIAN_FRONTEND=noninteractive apt-get -y -q
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ $(APT) install chromium >/dev/null 2>&1 || { $(APT) update >/dev/null && $(APT) install chromium >/dev/null; }; }; } || \
		echo "note: no chromium; tests/integration/test_html_report.py's browser test will skip"

demo: $(BIN)/.runtime
	mkdir -p out
	$(BIN)/grpo-cli compute sample_data/rollouts.parquet -o out/rollouts_with_advantages.parquet \
		--reward-col correct --force

# The float tests again under the baseline capability and one thread (the suite itself runs at
# this CPU's widest vector unit and its default threads): no result may depend on either.
# tests/integration/test_same_bits.py also runs whole processes under every capability this CPU has.
FLOAT_TESTS := tests/unit/test_kernel.py tests/unit/test_kernel_pieces.py tests/unit/test_magnitudes.py \
	tests/unit/test_verify.py tests/unit/test_properties.py tests/unit/test_findings.py tests/unit/test_exact.py \
	tests/integration/test_same_bits.py tests/oracles/test_trainer_filters.py tests/oracles/test_tolerance.py \
	tests/oracles/test_estimators.py tests/oracles/test_presets.py \
	grpo_cli/kernel grpo_cli/results/findings.py

# The docs site (mkdocs, material theme) into site/, a warning an error (strict: true in
# mkdocs.yml): a broken link or anchor fails the build, and `make test` builds it first.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --quiet

test: setup browser docs
	$(BIN)/python -m pytest --durations=15
	ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m "not slow" $(FLOAT_TESTS)

# The edit-test loop: the unit tests and the doctests, without the slow ones (under a minute
# on 2 cores); `make test` stays the whole suite.
test-fast: setup
	$(BIN)/python -m pytest -m "not slow" tests/unit grpo_cli

lint: setup
	$(BIN)/ruff check grpo_cli tests benchmarks sample_data docs
	$(BIN)/ruff format --check grpo_cli tests benchmarks sample_data docs
	$(BIN)/mypy

# After a deliberate change to the CLI: rewrite the help snapshots, the options
# reference (docs/cli.md), the estimator table and the docs' dump examples, then review the diff.
snapshots: setup
	UPDATE_SNAPSHOTS=1 $(BIN)/python -m pytest -q tests/integration/test_help_snapshots.py
	$(BIN)/python docs/gen_cli_reference.py
	$(BIN)/python docs/gen_dump_examples.py

# Rewrite sample_data/dumps with the trainers' own writer code (needs their fetched sources).
dumps: setup
	$(BIN)/python -m tests.dump_writers sample_data/dumps

bench: setup
	$(BIN)/python benchmarks/bench.py

bench-quick: setup
	$(BIN)/python benchmarks/bench.py --rows 1000000

# As a user runs it: each command a fresh process (wall, CPU, peak RSS, page faults), then how
# wall and memory grow to 100M rows (about 15 minutes, 5 GB of files under benchmarks/data/)
bench-process: setup
	$(BIN)/python benchmarks/process.py --scaling

# The CUDA path in one call, where a GPU is lent: the CUDA tests, the kernel on 10^8 and 10^9
# rollouts against the device's copy bandwidth, compute --device cuda against --device cpu.
# Exits 1 without CUDA. On a machine whose Python already holds a CUDA build of torch (and no
# network for the set-up), name it: `make gpu-check GPU_PYTHON=python3`.
GPU_PYTHON ?=
gpu-check: $(if $(GPU_PYTHON),,setup)
	$(or $(GPU_PYTHON),$(BIN)/python) benchmarks/gpu_check.py

# Mutation testing of the modules whose bugs corrupt data silently (over 2 hours on
# 2 cores); writes docs/mutation-report.md and fails below the targets. One thread per
# worker: torch's pools do not survive the fork mutmut makes per mutant. It starts from a
# clean mutants/ so that no result from an older test selection is kept.
mutation: setup
	rm -rf mutants
	OMP_NUM_THREADS=1 $(BIN)/mutmut run --max-children $$(nproc) > /dev/null
	$(BIN)/python .ci/mutation_report.py

clean:
	rm -rf $(VENV) out benchmarks/data mutants .pytest_cache .mypy_cache .ruff_cache
